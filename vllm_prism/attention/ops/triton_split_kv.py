"""Split-KV attention over vLLM's paged cache (BF16/FP16 or INT8 per token-head), in Triton.

(INT8 decode and INT8 verification go to the CUDA C++ kernels of :mod:`.cuda_decode` wherever
they can serve the call; ``kernel="triton"`` or ``VLLM_PRISM_ATTN_KERNEL=triton`` keeps them
here. Their segments are merged by this module's merge kernel.)

One kernel serves decode (one query token per request) and verification (2..16 query tokens
per request, e.g. k+1 speculative tokens); the cache dtype is a compile-time parameter, so the
BF16 and INT8 caches run the same code.

* **Grid** ``(requests, KV heads, segments [+ 1 tail])``. The query rows of one program are the
  request's query tokens folded into the GQA group: row ``r = t * G + g`` is query token ``t``
  of query head ``kv_head * G + g``, so one read of a K/V tile serves every query head of the
  group and every query token (``G * q_len`` rows, padded to 16, or to 64 / 128 beyond 16 rows:
  a warpgroup MMA tile; the geometry can ask for 64 rows for decode too).
* **Prefix** (positions ``0 .. seq_len - q_len - 1`` for verification, all positions for
  decode) is split into ``num_segments`` runs of whole tiles; every tile but the last partial
  one is read without masks. K and V rows are gathered through the block table (any block
  size, any physical layout), INT8 rows with their fp32 scale: ``S = (Q . K_int8^T) * k_scale``
  and ``P * v_scale`` before the ``P . V_int8`` product, so no dequantized copy exists.
* **Tail** (verification only): one extra program per (request, KV head) attends to the query
  tokens' own K/V with the exact causal mask (token ``t`` sees positions ``<= prefix + t``).
* **Merge**: each program stores its normalised partial output (fp32, or bf16 where the
  geometry says so: verification writes ``q_len`` times more partials) and its log2-sum-exp; a
  second kernel merges the segments of each (token, head). With one segment and no tail the
  first kernel writes the output itself.

**Integer Q.K** (``int_qk=True``, INT8 caches only, off by default): Q is quantised per
(token, head) to int8 (absmax / 127, round half away from zero) and ``Q_int8 . K_int8`` runs
on the integer tensor cores, rescaled by ``q_scale * k_scale``; P.V stays in bf16. Measured
error (relative L2 of the output against the fp32 reference on the dequantised cache; queries
N(0, 1), keys N(0, 1) with four channels x4; head dim 256, GQA 6):

* H200, contexts 4K / 32K / 128K (``tests/attention/test_attention_gpu.py::test_int_qk_error``):
  **8.3e-3** with integer Q.K against **2.3e-3** for the exact path (bf16 P.V and output);
* CPU interpreter, fp32 arithmetic elsewhere (``interpreter_checks.py::int_qk_error``):
  6.5e-3 against 3e-7, i.e. the Q quantisation alone adds ~6e-3.

It saves 6-8 % of the decode time at 32K-128K on the H200 (bench ``decode_int_qk`` rows) for
3.6x the error of the exact path, so it stays opt-in. Verification with ``int_qk`` runs on the
CUDA C++ verification kernel's integer variant where that kernel can serve the call
(:mod:`.cuda_decode`), here elsewhere.
"""

from __future__ import annotations

import logging
import math

import torch

from vllm_prism import envs
from vllm_prism.attention.ops import cuda_decode
from vllm_prism.attention.ops.cuda_decode import (cuda_decode_problem, cuda_verify_problem,
                                                  attention_pdl, launch_cuda_decode,
                                                  launch_cuda_verify, num_cuda_segments)
from vllm_prism.attention.ops.geometry import (SplitGeometry, gpu_geometry, num_segments,
                                               sm_count)
from vllm_prism.attention.ops.layout import KVFormat, kv_format
from vllm_prism.attention.ops.metadata import AttentionMetadata

from vllm_prism.kernels.common import HAS_TRITON, interpreting, next_power_of_2, pdl_launch

if HAS_TRITON:
    import triton
    import triton.language as tl

    from vllm_prism.kernels.common import pdl_enter

__all__ = ["ATTN_KERNELS", "INT_QK_ERROR", "MAX_VERIFY_TOKENS", "decode_attention",
           "noncausal_attention", "split_kv_attention", "verify_attention"]

logger = logging.getLogger(__name__)
_LOGGED: set[tuple[str, str | None]] = set()

MAX_VERIFY_TOKENS = 16
ATTN_KERNELS = ("auto", "triton", "cuda")
LOG2E = 1.4426950408889634

# Relative L2 error of the output against the fp32 reference on the dequantised cache (see the
# module docstring for the setup).
INT_QK_ERROR = {
    "h200_int_qk": 8.3e-3, "h200_exact": 2.3e-3,
    "interpreter_int_qk": 6.5e-3, "interpreter_exact": 3e-7,
}


if HAS_TRITON:

    @triton.jit
    def _operand(x, CDT: tl.constexpr, I8_F16: tl.constexpr):
        """An MMA operand of ``CDT`` from a cache tile. With ``I8_F16`` (INT8 cache, CDT fp16)
        the int8 values become fp16 from their bits: ``v + 0x6480`` as int16 is the fp16 bit
        pattern of ``1152 + v`` (exponent 2**10, mantissa ``128 + v``), so one integer add, a
        reinterpretation and one fp16 subtraction give ``v`` exactly."""
        if I8_F16:
            return (x.to(tl.int16) + 0x6480).to(tl.float16, bitcast=True) - 1152.0
        return x.to(CDT)

    @triton.jit
    def _attend_tile(acc, m_i, l_i, q_op, q_scale, t_row, cache_ptr, bt_row_ptr, pos0, limit,
                     causal_base, kvh_off, stride_cb, stride_cn, block_size, qk_scale,
                     HEAD_DIM: tl.constexpr, TILE: tl.constexpr, K_OFF: tl.constexpr,
                     V_OFF: tl.constexpr, KS_OFF: tl.constexpr, VS_OFF: tl.constexpr,
                     IS_INT8: tl.constexpr, INT_QK: tl.constexpr, MASKED: tl.constexpr,
                     ROW_ALIGN: tl.constexpr, CDT: tl.constexpr, I8_F16: tl.constexpr):
        offs_n = tl.arange(0, TILE)
        d = tl.arange(0, HEAD_DIM)
        pos = pos0 + offs_n
        if MASKED:
            kmask = pos < limit
            blk = tl.load(bt_row_ptr + pos // block_size, mask=kmask, other=0)
        else:
            blk = tl.load(bt_row_ptr + pos // block_size)
        row = blk.to(tl.int64) * stride_cb + (pos % block_size).to(tl.int64) * stride_cn + kvh_off
        row = tl.multiple_of(row, ROW_ALIGN)
        k_ptrs = cache_ptr + row[:, None] + (K_OFF + d)[None, :]
        v_ptrs = cache_ptr + row[:, None] + (V_OFF + d)[None, :]
        if MASKED:
            k = tl.load(k_ptrs, mask=kmask[:, None], other=0)
        else:
            k = tl.load(k_ptrs)
        if IS_INT8:
            ks_ptrs = (cache_ptr + row + KS_OFF).to(tl.pointer_type(tl.float32), bitcast=True)
            if MASKED:
                ks = tl.load(ks_ptrs, mask=kmask, other=0.0)
            else:
                ks = tl.load(ks_ptrs)
        if INT_QK:
            s = tl.dot(q_op, tl.trans(k), out_dtype=tl.int32).to(tl.float32)
            s = s * (q_scale * qk_scale)[:, None] * ks[None, :]
        else:
            s = tl.dot(q_op, tl.trans(_operand(k, CDT, I8_F16)))
            if IS_INT8:
                s = s * ks[None, :]
            s = s * qk_scale
        if MASKED:
            valid = kmask[None, :] & (pos[None, :] <= causal_base + t_row[:, None])
            s = tl.where(valid, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        if MASKED:
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        else:
            m_use = m_new
        alpha = tl.exp2(m_i - m_use)
        p = tl.exp2(s - m_use[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if MASKED:
            v = tl.load(v_ptrs, mask=kmask[:, None], other=0)
        else:
            v = tl.load(v_ptrs)
        if IS_INT8:
            vs_ptrs = (cache_ptr + row + VS_OFF).to(tl.pointer_type(tl.float32), bitcast=True)
            if MASKED:
                vs = tl.load(vs_ptrs, mask=kmask, other=0.0)
            else:
                vs = tl.load(vs_ptrs)
            pv = (p * vs[None, :]).to(CDT)
        else:
            pv = p.to(CDT)
        acc = acc * alpha[:, None] + tl.dot(pv, _operand(v, CDT, I8_F16))
        return acc, m_new, l_i

    @triton.jit
    def _tile_rows(bt_row_ptr, pos0, limit, kvh_off, stride_cb, stride_cn, block_size,
                   TILE: tl.constexpr, ROW_ALIGN: tl.constexpr):
        """Row offsets of the ``TILE`` positions from ``pos0``, and which are ``< limit``."""
        pos = pos0 + tl.arange(0, TILE)
        ok = pos < limit
        blk = tl.load(bt_row_ptr + pos // block_size, mask=ok, other=0)
        row = blk.to(tl.int64) * stride_cb + (pos % block_size).to(tl.int64) * stride_cn + kvh_off
        return tl.multiple_of(row, ROW_ALIGN), ok

    @triton.jit
    def _load_kv(cache_ptr, row, ok, HEAD_DIM: tl.constexpr, TILE: tl.constexpr,
                 K_OFF: tl.constexpr, V_OFF: tl.constexpr, KS_OFF: tl.constexpr,
                 VS_OFF: tl.constexpr, IS_INT8: tl.constexpr):
        """K, V rows (and their fp32 scales for INT8) of one tile; zeros where not ``ok``."""
        d = tl.arange(0, HEAD_DIM)
        okr = ok
        k = tl.load(cache_ptr + row[:, None] + (K_OFF + d)[None, :], mask=okr[:, None], other=0)
        v = tl.load(cache_ptr + row[:, None] + (V_OFF + d)[None, :], mask=okr[:, None], other=0)
        if IS_INT8:
            ks = tl.load((cache_ptr + row + KS_OFF).to(tl.pointer_type(tl.float32), bitcast=True),
                         mask=okr, other=0.0)
            vs = tl.load((cache_ptr + row + VS_OFF).to(tl.pointer_type(tl.float32), bitcast=True),
                         mask=okr, other=0.0)
        else:
            ks = tl.full([TILE], 1.0, tl.float32)
            vs = tl.full([TILE], 1.0, tl.float32)
        return k, v, ks, vs

    @triton.jit
    def _attend_loaded(acc, m_i, l_i, q_op, q_scale, qk_scale, k, v, ks, vs,
                       IS_INT8: tl.constexpr, INT_QK: tl.constexpr, CDT: tl.constexpr,
                       I8_F16: tl.constexpr):
        """Online-softmax update with a full (unmasked) tile already in registers."""
        if INT_QK:
            s = tl.dot(q_op, tl.trans(k), out_dtype=tl.int32).to(tl.float32)
            s = s * (q_scale * qk_scale)[:, None] * ks[None, :]
        else:
            s = tl.dot(q_op, tl.trans(_operand(k, CDT, I8_F16)))
            if IS_INT8:
                s = s * ks[None, :]
            s = s * qk_scale
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if IS_INT8:
            pv = (p * vs[None, :]).to(CDT)
        else:
            pv = p.to(CDT)
        acc = acc * alpha[:, None] + tl.dot(pv, _operand(v, CDT, I8_F16))
        return acc, m_new, l_i

    @triton.jit
    def _split_kv_kernel(q_ptr, cache_ptr, bt_ptr, seq_lens_ptr, qsl_ptr, req_ids_ptr,
                         out_ptr, part_o_ptr, part_lse_ptr, qk_scale,
                         stride_qt, stride_qh, stride_cb, stride_ch, stride_cn, stride_bt,
                         stride_ot, stride_oh, block_size,
                         stride_pr, stride_pt, stride_ph, stride_ps,
                         stride_lr, stride_lt, stride_lh, NUM_SEGS, MIN_TILES,
                         HEAD_DIM: tl.constexpr, GROUP: tl.constexpr, BLOCK_M: tl.constexpr,
                         TILE: tl.constexpr, HAS_TAIL: tl.constexpr,
                         K_OFF: tl.constexpr, V_OFF: tl.constexpr,
                         KS_OFF: tl.constexpr, VS_OFF: tl.constexpr, IS_INT8: tl.constexpr,
                         INT_QK: tl.constexpr, ROW_ALIGN: tl.constexpr,
                         DIRECT_OUT: tl.constexpr, CDT: tl.constexpr,
                         HAS_REQ_IDS: tl.constexpr, PREFETCH: tl.constexpr,
                         I8_F16: tl.constexpr = False):
        sel = tl.program_id(0)
        kvh = tl.program_id(1)
        seg = tl.program_id(2)
        if HAS_REQ_IDS:
            req = tl.load(req_ids_ptr + sel)
        else:
            req = sel
        q_start = tl.load(qsl_ptr + req)
        q_len = tl.load(qsl_ptr + req + 1) - q_start
        seq_len = tl.load(seq_lens_ptr + req)

        rows = tl.arange(0, BLOCK_M)
        t_row = rows // GROUP
        head = kvh * GROUP + rows % GROUP
        row_ok = t_row < q_len
        d = tl.arange(0, HEAD_DIM)
        q_ptrs = (q_ptr + (q_start + t_row).to(tl.int64)[:, None] * stride_qt
                  + head[:, None] * stride_qh + d[None, :])
        q = tl.load(q_ptrs, mask=row_ok[:, None], other=0.0)
        if INT_QK:
            qf = q.to(tl.float32)
            q_scale = tl.maximum(tl.max(tl.abs(qf), 1) / 127.0, 1e-20)
            qq = qf / q_scale[:, None]
            qq = tl.where(qq >= 0, qq + 0.5, qq - 0.5)
            q_op = qq.to(tl.int8)
        else:
            q_op = q.to(CDT)
            q_scale = tl.full([BLOCK_M], 1.0, tl.float32)

        bt_row = bt_ptr + req.to(tl.int64) * stride_bt
        kvh_off = kvh.to(tl.int64) * stride_ch
        if HAS_TAIL:
            # never below 0: vLLM's full-graph capture metadata sets every seq_len to 1 and
            # Model Runner V2 runs it once (warm-up) with k + 1 query tokens a request
            prefix = tl.maximum(seq_len - q_len, 0)
            is_tail = seg == NUM_SEGS
        else:
            prefix = seq_len
            is_tail = seg > NUM_SEGS  # never

        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)

        n_tiles = tl.cdiv(prefix, TILE)
        tps = tl.maximum(tl.cdiv(n_tiles, NUM_SEGS), MIN_TILES)
        t0 = seg * tps
        t1 = tl.minimum(t0 + tps, n_tiles)
        t_full = tl.maximum(tl.minimum(t1, prefix // TILE), t0)
        t0 = tl.where(is_tail, 0, t0)
        t_full = tl.where(is_tail, 0, t_full)
        t1 = tl.where(is_tail, 0, t1)
        if PREFETCH:
            # Software pipeline by hand: the K/V rows of tile i+1 and the block ids of tile i+2
            # are requested before tile i is consumed, so a load's latency overlaps the math
            # (Triton's own pipeliner does not overlap these block-table-indirect loads).
            lim = t_full * TILE  # full tiles only: a tile is valid or entirely masked
            row_c, ok_c = _tile_rows(bt_row, t0 * TILE, lim, kvh_off, stride_cb, stride_cn,
                                     block_size, TILE, ROW_ALIGN)
            k_c, v_c, ks_c, vs_c = _load_kv(cache_ptr, row_c, ok_c, HEAD_DIM, TILE,
                                            K_OFF, V_OFF, KS_OFF, VS_OFF, IS_INT8)
            row_n, ok_n = _tile_rows(bt_row, (t0 + 1) * TILE, lim, kvh_off, stride_cb,
                                     stride_cn, block_size, TILE, ROW_ALIGN)
            for ti in range(t0, t_full):
                k_n, v_n, ks_n, vs_n = _load_kv(cache_ptr, row_n, ok_n, HEAD_DIM,
                                                TILE, K_OFF, V_OFF, KS_OFF, VS_OFF, IS_INT8)
                row_n, ok_n = _tile_rows(bt_row, (ti + 2) * TILE, lim, kvh_off,
                                         stride_cb, stride_cn, block_size, TILE, ROW_ALIGN)
                acc, m_i, l_i = _attend_loaded(acc, m_i, l_i, q_op, q_scale, qk_scale, k_c, v_c,
                                               ks_c, vs_c, IS_INT8, INT_QK, CDT, I8_F16)
                k_c, v_c, ks_c, vs_c = k_n, v_n, ks_n, vs_n
        else:
            for ti in range(t0, t_full):
                acc, m_i, l_i = _attend_tile(
                    acc, m_i, l_i, q_op, q_scale, t_row, cache_ptr, bt_row, ti * TILE, prefix,
                    prefix, kvh_off, stride_cb, stride_cn, block_size, qk_scale,
                    HEAD_DIM, TILE, K_OFF, V_OFF, KS_OFF, VS_OFF, IS_INT8, INT_QK, False,
                    ROW_ALIGN, CDT, I8_F16)
        if (t_full < t1) | is_tail:
            pos0 = tl.where(is_tail, prefix, t_full * TILE)
            limit = tl.where(is_tail, seq_len, prefix)
            acc, m_i, l_i = _attend_tile(
                acc, m_i, l_i, q_op, q_scale, t_row, cache_ptr, bt_row, pos0, limit,
                prefix, kvh_off, stride_cb, stride_cn, block_size, qk_scale,
                HEAD_DIM, TILE, K_OFF, V_OFF, KS_OFF, VS_OFF, IS_INT8, INT_QK, True,
                ROW_ALIGN, CDT, I8_F16)

        has = l_i > 0.0
        o = acc / tl.where(has, l_i, 1.0)[:, None]
        if DIRECT_OUT:
            o_ptrs = (out_ptr + (q_start + t_row).to(tl.int64)[:, None] * stride_ot
                      + head[:, None] * stride_oh + d[None, :])
            tl.store(o_ptrs, o.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])
        else:
            lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf"))
            base = sel.to(tl.int64) * stride_pr + t_row.to(tl.int64) * stride_pt
            po_ptrs = (part_o_ptr + (base + head * stride_ph + seg * stride_ps)[:, None]
                       + d[None, :])
            tl.store(po_ptrs, o.to(part_o_ptr.dtype.element_ty), mask=(row_ok & has)[:, None])
            pl_ptrs = (part_lse_ptr + sel.to(tl.int64) * stride_lr
                       + t_row.to(tl.int64) * stride_lt + head * stride_lh + seg)
            tl.store(pl_ptrs, lse, mask=row_ok)

    @triton.jit
    def _merge_kernel(part_o_ptr, part_lse_ptr, out_ptr, req_ids_ptr, qsl_ptr,
                      stride_pr, stride_pt, stride_ph, stride_ps,
                      stride_lr, stride_lt, stride_lh, stride_ot, stride_oh, NSEG, max_q,
                      NSEG_P2: tl.constexpr, DCHUNK: tl.constexpr, HAS_REQ_IDS: tl.constexpr,
                      PDL: tl.constexpr = False):
        # max_q is a runtime value (one compiled merge serves verification of 2..16 tokens: a
        # first 9-token chunk in a server's life does not wait for a compile)
        pdl_enter(PDL)
        pid = tl.program_id(0)
        h = tl.program_id(1)
        dc = tl.program_id(2)
        sel = pid // max_q
        t = pid % max_q
        if HAS_REQ_IDS:
            req = tl.load(req_ids_ptr + sel)
        else:
            req = sel
        q_start = tl.load(qsl_ptr + req)
        q_len = tl.load(qsl_ptr + req + 1) - q_start
        if t < q_len:
            s = tl.arange(0, NSEG_P2)
            d = dc * DCHUNK + tl.arange(0, DCHUNK)
            lse = tl.load(part_lse_ptr + sel.to(tl.int64) * stride_lr + t * stride_lt
                          + h * stride_lh + s, mask=s < NSEG, other=float("-inf"))
            ok = lse > float("-inf")
            m = tl.max(lse, 0)
            w = tl.where(ok, tl.exp2(lse - m), 0.0)
            o_ptrs = (part_o_ptr + sel.to(tl.int64) * stride_pr + t * stride_pt + h * stride_ph
                      + s[:, None] * stride_ps + d[None, :])
            o = tl.load(o_ptrs, mask=ok[:, None], other=0.0).to(tl.float32)
            res = tl.sum(o * w[:, None], 0) / tl.sum(w, 0)
            tl.store(out_ptr + (q_start + t).to(tl.int64) * stride_ot + h * stride_oh + d,
                     res.to(out_ptr.dtype.element_ty))


def _tl_dtype(dtype: torch.dtype):
    # The interpreter multiplies bf16 operands as their raw 16-bit patterns: dot in fp32 there.
    if interpreting():
        return tl.float32
    return {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}[dtype]


def _check_inputs(q: torch.Tensor, kv_cache: torch.Tensor) -> KVFormat:
    if not HAS_TRITON:
        raise RuntimeError("the prism attention kernels need Triton")
    if q.dim() != 3:
        raise ValueError(f"q must be [num_tokens, num_heads, head_size], got {tuple(q.shape)}")
    if q.dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"q dtype {q.dtype} is not supported (bfloat16 or float16)")
    if q.stride(2) != 1:
        raise ValueError("q must be contiguous in the head dimension")
    fmt = kv_format(kv_cache, q.shape[2])
    if q.shape[1] % fmt.num_kv_heads:
        raise ValueError(f"{q.shape[1]} query heads are not a multiple of "
                         f"{fmt.num_kv_heads} KV heads")
    return fmt


def split_kv_attention(q: torch.Tensor, kv_cache: torch.Tensor, md: AttentionMetadata, *,
                       scale: float, max_q: int, out: torch.Tensor | None = None,
                       req_ids: torch.Tensor | None = None, int_qk: bool = False,
                       geometry: SplitGeometry | None = None,
                       num_segs: int | None = None, kernel: str | None = None,
                       causal: bool = True) -> torch.Tensor:
    """Attention of the last ``q_len <= max_q`` tokens of each selected request.

    ``max_q == 1`` is decode (no tail program); ``max_q > 1`` is verification (prefix split +
    exact causal tail), or with ``causal=False`` every query token against all ``seq_len``
    positions, split like a decode (a DFlash drafter's non-causal block). ``req_ids`` (int32,
    on the device) selects requests of a mixed batch; the output rows of the other requests
    are left untouched. Graph-safe: nothing here reads device values on the host.

    ``kernel`` (default: the ``VLLM_PRISM_ATTN_KERNEL`` switch, ``auto``): ``auto`` runs INT8
    decode and INT8 verification on the CUDA C++ kernels (:mod:`.cuda_decode`) wherever they
    can serve the call and everything else here; ``triton`` always here; ``cuda`` the same as
    ``auto``, but passed as ``kernel="cuda"`` it requires the CUDA kernels (an error names why
    one cannot serve a call); from the switch, a call they cannot serve runs here.
    """
    fmt = _check_inputs(q, kv_cache)
    if out is None:
        out = torch.empty_like(q)
    out3 = out.view(q.shape)
    has_ids = req_ids is not None
    n_sel = req_ids.shape[0] if has_ids else md.num_reqs
    if not has_ids:
        req_ids = md.query_start_loc  # unused placeholder pointer
    if n_sel == 0:
        return out
    if not 1 <= max_q <= MAX_VERIFY_TOKENS:
        raise ValueError(f"split-KV attention takes 1..{MAX_VERIFY_TOKENS} query tokens per "
                         f"request, not {max_q}; longer chunks go through prefill_attention")
    if int_qk and not fmt.is_int8:
        raise ValueError("int_qk needs an INT8 cache (--kv-cache-dtype int8_per_token_head)")
    verify = max_q > 1
    choice = kernel or envs.VLLM_PRISM_ATTN_KERNEL
    if choice not in ATTN_KERNELS:
        raise ValueError(f"attention kernel {choice!r} is not one of {ATTN_KERNELS} "
                         "(VLLM_PRISM_ATTN_KERNEL)")
    if choice != "triton" and fmt.is_int8 and (verify or not int_qk) and (causal or not verify):
        if verify:
            why = cuda_verify_problem(q, kv_cache, fmt, out3, max_q)
        else:
            why = cuda_decode_problem(q, kv_cache, fmt, out3)
        _log_cuda_choice("verification" if verify else "decode", why)
        if why is None:
            _cuda_split_kv(q, kv_cache, md, out3, req_ids if has_ids else None, n_sel, scale,
                           max_q, num_segs, int_qk, pdl=causal and attention_pdl(q.device))
            return out
        if kernel == "cuda":
            raise ValueError(f"the CUDA attention kernel cannot serve this call: {why}")
    elif kernel == "cuda":
        raise ValueError("the CUDA attention kernels serve the INT8 cache (int8_per_token_head): "
                         "decode with exact Q.K, causal verification with exact or integer Q.K")
    geom = geometry or gpu_geometry(q.device).pick(verify, fmt.is_int8)
    nkv = fmt.num_kv_heads
    group = q.shape[1] // nkv
    rows = max_q * group
    # 17..64 rows take a 64-row tile (one warpgroup MMA; 32-row tiles spill on sm_90)
    block_m = 16 if rows <= 16 else max(64, next_power_of_2(rows))
    block_m = max(block_m, geom.block_m_min)
    tile, warps = geom.tile, geom.num_warps
    if block_m >= 128:  # 65..128 rows: narrower K/V tiles and 8 warps keep it in registers
        tile, warps = min(tile, 32), max(warps, 8)
    if tile < max_q or tile & (tile - 1) or tile < 16:
        raise ValueError(f"tile {tile} must be a power of two >= 16 and >= {max_q}")
    segs = num_segs or num_segments(geom, n_sel, nkv, sm_count(q.device))
    has_tail = verify and causal
    nseg_t = segs + int(has_tail)
    direct = nseg_t == 1
    if direct:
        part_o = torch.empty(1, 1, 1, 1, 1, dtype=torch.float32, device=q.device)
        part_lse = torch.empty(1, 1, 1, 1, dtype=torch.float32, device=q.device)
    else:
        part_o = torch.empty(n_sel, max_q, q.shape[1], nseg_t, fmt.head_size,
                             dtype=torch.bfloat16 if geom.partial_bf16 else torch.float32,
                             device=q.device)
        part_lse = torch.empty(n_sel, max_q, q.shape[1], nseg_t, dtype=torch.float32,
                               device=q.device)
    i8_f16 = geom.i8_f16 and fmt.is_int8 and not int_qk
    cdt = tl.float16 if i8_f16 else _tl_dtype(q.dtype)
    _split_kv_kernel[(n_sel, nkv, nseg_t)](
        q, kv_cache, md.block_table, md.seq_lens, md.query_start_loc, req_ids,
        out3, part_o, part_lse, scale * LOG2E,
        q.stride(0), q.stride(1), fmt.stride_block, fmt.stride_head, fmt.stride_slot,
        md.block_table.stride(0), out3.stride(0), out3.stride(1), fmt.block_size,
        part_o.stride(0), part_o.stride(1), part_o.stride(2), part_o.stride(3),
        part_lse.stride(0), part_lse.stride(1), part_lse.stride(2),
        segs, geom.min_tiles_per_segment,
        HEAD_DIM=fmt.head_size, GROUP=group, BLOCK_M=block_m, TILE=tile,
        HAS_TAIL=has_tail, K_OFF=fmt.k_off,
        V_OFF=fmt.v_off, KS_OFF=max(fmt.k_scale_off, 0), VS_OFF=max(fmt.v_scale_off, 0),
        IS_INT8=fmt.is_int8, INT_QK=int_qk, ROW_ALIGN=fmt.row_align, DIRECT_OUT=direct,
        CDT=cdt, HAS_REQ_IDS=has_ids, PREFETCH=geom.prefetch, I8_F16=i8_f16, num_warps=warps,
        num_stages=1 if geom.prefetch else geom.num_stages)
    if not direct:
        _merge(part_o, part_lse, out3, req_ids, md, n_sel, max_q, nseg_t, has_ids)
    return out


def _log_cuda_choice(kind: str, why: str | None) -> None:
    """Say once per process (and per reason) which kernel INT8 decode or verification
    attention runs."""
    if (kind, why) in _LOGGED:
        return
    _LOGGED.add((kind, why))
    if why is None:
        logger.info("PRISM attention: INT8 %s on the CUDA C++ kernel (vllm_prism._C)", kind)
    else:
        logger.info("PRISM attention: INT8 %s on the Triton kernel (%s)", kind, why)


def _merge(part_o: torch.Tensor, part_lse: torch.Tensor, out3: torch.Tensor,
           req_ids: torch.Tensor, md: AttentionMetadata, n_sel: int, max_q: int, nseg: int,
           has_ids: bool, pdl: bool = False) -> None:
    """Merge the ``nseg`` segments' partial outputs of each (query token, head) into ``out3``
    by their log2-sum-exp; ``pdl``: launched while the kernel that wrote them finishes."""
    head_size = part_o.shape[-1]
    nseg_p2 = max(2, next_power_of_2(nseg))
    dchunk = max(16, min(head_size, 8192 // nseg_p2))
    _merge_kernel[(n_sel * max_q, out3.shape[1], head_size // dchunk)](
        part_o, part_lse, out3, req_ids, md.query_start_loc,
        part_o.stride(0), part_o.stride(1), part_o.stride(2), part_o.stride(3),
        part_lse.stride(0), part_lse.stride(1), part_lse.stride(2),
        out3.stride(0), out3.stride(1), nseg,
        max_q, NSEG_P2=nseg_p2, DCHUNK=dchunk, HAS_REQ_IDS=has_ids, PDL=pdl, num_warps=4,
        **pdl_launch(pdl))


def _cuda_split_kv(q: torch.Tensor, kv_cache: torch.Tensor, md: AttentionMetadata,
                   out3: torch.Tensor, req_ids: torch.Tensor | None, n_sel: int, scale: float,
                   max_q: int, num_segs: int | None, int_qk: bool = False,
                   pdl: bool = False) -> None:
    """INT8 decode (``max_q == 1``: one CTA per request and segment, every KV head) or
    verification (one CTA per request, KV head and segment; ``int_qk``: Q.K on the int8
    tensor cores) on the CUDA C++ kernels, merged here when they split the context; ``pdl``:
    the kernels and the merge with programmatic dependent launch (causal calls only)."""
    verify = max_q > 1
    nkv = kv_cache.shape[1] if verify else 1
    # read from the module at each call: a benchmark varies them
    per_sm = cuda_decode.VERIFY_CTAS_PER_SM if verify else cuda_decode.CTAS_PER_SM
    segs = num_segs or num_cuda_segments(n_sel, sm_count(q.device), nkv, per_sm)
    hq, hs = q.shape[1], q.shape[2]
    if segs > 1:
        part_o = torch.empty(n_sel, max_q, hq, segs, hs, dtype=cuda_decode.PARTIALS_DTYPE,
                             device=q.device)
        part_lse = torch.empty(n_sel, max_q, hq, segs, dtype=torch.float32, device=q.device)
    else:
        part_o = part_lse = torch.empty(0, dtype=torch.float32, device=q.device)
    args = (q, kv_cache, md.block_table, md.seq_lens, md.query_start_loc, req_ids, out3, part_o,
            part_lse, scale)
    if verify:
        launch_cuda_verify(*args, max_q, segs, int_qk, pdl)
    else:
        launch_cuda_decode(*args, segs, pdl)
    if segs > 1:
        ids = md.query_start_loc if req_ids is None else req_ids
        _merge(part_o, part_lse, out3, ids, md, n_sel, max_q, segs, req_ids is not None, pdl)


def decode_attention(q: torch.Tensor, kv_cache: torch.Tensor, md: AttentionMetadata, *,
                     scale: float | None = None, out: torch.Tensor | None = None,
                     req_ids: torch.Tensor | None = None, int_qk: bool = False,
                     geometry: SplitGeometry | None = None,
                     num_segs: int | None = None, kernel: str | None = None) -> torch.Tensor:
    """One query token per request: ``q [num_reqs, num_heads, head_size]`` (rows in
    ``query_start_loc`` order) against the whole cached context of each request; ``kernel``
    as in :func:`split_kv_attention`."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    return split_kv_attention(q, kv_cache, md, scale=scale, max_q=1, out=out, req_ids=req_ids,
                              int_qk=int_qk, geometry=geometry, num_segs=num_segs,
                              kernel=kernel)


def verify_attention(q: torch.Tensor, kv_cache: torch.Tensor, md: AttentionMetadata, *,
                     scale: float | None = None, max_query_len: int | None = None,
                     out: torch.Tensor | None = None, req_ids: torch.Tensor | None = None,
                     int_qk: bool = False, geometry: SplitGeometry | None = None,
                     num_segs: int | None = None, kernel: str | None = None) -> torch.Tensor:
    """2..16 query tokens per request (speculative verification, short chunks): the shared
    prefix through the split path with the tokens folded into the GQA group, plus an exact
    causal tail over the tokens' own K/V, merged by log-sum-exp."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    max_q = md.max_query_len if max_query_len is None else max_query_len
    return split_kv_attention(q, kv_cache, md, scale=scale, max_q=max(2, max_q), out=out,
                              req_ids=req_ids, int_qk=int_qk, geometry=geometry,
                              num_segs=num_segs, kernel=kernel)


def noncausal_attention(q: torch.Tensor, kv_cache: torch.Tensor, md: AttentionMetadata, *,
                        scale: float | None = None, max_query_len: int | None = None,
                        out: torch.Tensor | None = None, req_ids: torch.Tensor | None = None,
                        geometry: SplitGeometry | None = None,
                        num_segs: int | None = None) -> torch.Tensor:
    """1..16 query tokens per request, each attending to all ``seq_len`` cached positions of
    its request, its own block included (a DFlash drafter's draft block): the whole sequence
    through the split path with the tokens folded into the GQA group, no causal tail. On the
    Triton kernel for every cache dtype (the CUDA verification kernel is causal)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    max_q = md.max_query_len if max_query_len is None else max_query_len
    return split_kv_attention(q, kv_cache, md, scale=scale, max_q=max(1, max_q), out=out,
                              req_ids=req_ids, geometry=geometry, num_segs=num_segs,
                              causal=False)
