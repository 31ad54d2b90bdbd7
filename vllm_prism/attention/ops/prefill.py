"""Prefill (long query chunks) over the paged cache, BF16 or INT8, in bounded memory.

For each prefill request (query tokens at positions ``c .. c + m - 1``, all ``c + m`` positions
already in the cache), the key range ``0 .. c + m - 1`` is walked in sections of at most
``section_tokens`` (32K by default) positions. Each section is gathered through the block table
and dequantised by a Triton kernel into one reusable BF16 scratch ``[2, section, nkv, hs]``
(at most ``SCRATCH_BYTES`` = 128 MiB: 32K tokens x 4 KV heads x 256 x K,V x 2 bytes), and a
section-attention function runs on it:

* query rows that see the whole section: plain (non-causal) attention;
* query rows whose position falls inside the section: causal, bottom-right aligned (the last
  of those rows sees the section up to its own position).

Each call returns the output and its log-sum-exp; sections are merged exactly by log-sum-exp.
The scratch never grows with the context; the fp32 accumulators grow with the chunk only. A
request whose whole key range fits one section (every prompt up to 32K tokens) takes one causal
call written straight into the output: no accumulators, no merge.

The section-attention function is a hook (``attn_fn``): ``attn_fn(q, k, v, causal, scale) ->
(out, lse)`` with ``q [m, Hq, hs]``, ``k, v [n, Hkv, hs]`` (GQA, ``Hq % Hkv == 0``), ``causal``
bottom-right aligned (``n >= m``), ``out [m, Hq, hs]``, ``lse [Hq, m]`` fp32 natural log. A
flash-attn varlen function fits directly (``flash_attn_varlen_func(..., causal=causal,
return_softmax_lse=True)`` with one sequence); the default, :func:`sdpa_section_attention`, uses
torch's flash SDPA ops, which return the log-sum-exp.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence

import torch

from vllm_prism.attention.ops.layout import kv_format
from vllm_prism.attention.ops.metadata import AttentionMetadata

from vllm_prism.kernels.common import HAS_TRITON

if HAS_TRITON:
    import triton
    import triton.language as tl

__all__ = ["SCRATCH_BYTES", "MAX_SECTION_TOKENS", "SectionAttention", "sdpa_section_attention",
           "gather_kv_bf16", "prefill_attention", "section_tokens_for", "warm_gather_kv"]

SCRATCH_BYTES = 128 << 20
MAX_SECTION_TOKENS = 32768
SQUARE_ROWS = 2048  # causal block size when GQA must be expanded (bounds that copy)
# None: probe once per device whether torch's flash op takes fewer KV heads than query heads;
# True / False force it (tests exercise the expanding path this way).
NATIVE_GQA: bool | None = None

SectionAttention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, bool, float],
                            tuple[torch.Tensor, torch.Tensor]]


if HAS_TRITON:

    # One compilation for every request and chunk: the chunk's start and length and the block
    # table row's address (its alignment follows the request's row) vary call by call, and
    # each combination of Triton's divisibility hints would compile once more while a fresh
    # server serves its first requests (vLLM's JIT monitor flagged it on the H200).
    @triton.jit(do_not_specialize=["start", "n_tok"],
                do_not_specialize_on_alignment=["bt_row_ptr", "start", "n_tok"])
    def _gather_kv_kernel(cache_ptr, bt_row_ptr, k_out_ptr, v_out_ptr, start, n_tok,
                          stride_cb, stride_ch, stride_cn, block_size,
                          stride_ot, stride_oh,
                          HEAD_DIM: tl.constexpr, TILE: tl.constexpr, K_OFF: tl.constexpr,
                          V_OFF: tl.constexpr, KS_OFF: tl.constexpr, VS_OFF: tl.constexpr,
                          IS_INT8: tl.constexpr, ROW_ALIGN: tl.constexpr):
        pid = tl.program_id(0)
        h = tl.program_id(1)
        i = pid * TILE + tl.arange(0, TILE)
        ok = i < n_tok
        pos = start + i
        d = tl.arange(0, HEAD_DIM)
        blk = tl.load(bt_row_ptr + pos // block_size, mask=ok, other=0)
        row = (blk.to(tl.int64) * stride_cb + (pos % block_size).to(tl.int64) * stride_cn
               + h.to(tl.int64) * stride_ch)
        row = tl.multiple_of(row, ROW_ALIGN)
        k = tl.load(cache_ptr + row[:, None] + (K_OFF + d)[None, :], mask=ok[:, None], other=0)
        v = tl.load(cache_ptr + row[:, None] + (V_OFF + d)[None, :], mask=ok[:, None], other=0)
        if IS_INT8:
            ks = tl.load((cache_ptr + row + KS_OFF).to(tl.pointer_type(tl.float32), bitcast=True),
                         mask=ok, other=0.0)
            vs = tl.load((cache_ptr + row + VS_OFF).to(tl.pointer_type(tl.float32), bitcast=True),
                         mask=ok, other=0.0)
            kf = k.to(tl.float32) * ks[:, None]
            vf = v.to(tl.float32) * vs[:, None]
        else:
            kf = k
            vf = v
        o = i.to(tl.int64)[:, None] * stride_ot + h * stride_oh + d[None, :]
        tl.store(k_out_ptr + o, kf.to(k_out_ptr.dtype.element_ty), mask=ok[:, None])
        tl.store(v_out_ptr + o, vf.to(v_out_ptr.dtype.element_ty), mask=ok[:, None])


def gather_kv_bf16(kv_cache: torch.Tensor, block_row: torch.Tensor, start: int, n: int,
                   k_out: torch.Tensor, v_out: torch.Tensor, tile: int = 32) -> None:
    """Positions ``start .. start + n - 1`` of one request (block-table row ``block_row``) as
    ``k_out[:n], v_out[:n]`` ``[n, nkv, hs]`` in their float dtype (INT8 dequantised)."""
    fmt = kv_format(kv_cache)
    if n <= 0:
        return
    _gather_kv_kernel[(triton.cdiv(n, tile), fmt.num_kv_heads)](
        kv_cache, block_row, k_out, v_out, start, n,
        fmt.stride_block, fmt.stride_head, fmt.stride_slot, fmt.block_size,
        k_out.stride(0), k_out.stride(1),
        HEAD_DIM=fmt.head_size, TILE=tile, K_OFF=fmt.k_off, V_OFF=fmt.v_off,
        KS_OFF=max(fmt.k_scale_off, 0), VS_OFF=max(fmt.v_scale_off, 0), IS_INT8=fmt.is_int8,
        ROW_ALIGN=fmt.row_align, num_warps=4)


# (device, cache layout, scratch dtype) whose gather kernel has run (warm_gather_kv)
_GATHER_WARM: set[tuple] = set()


def warm_gather_kv(kv_cache: torch.Tensor, dtype: torch.dtype,
                   head_size: int | None = None) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Run the gather kernel once, on position 0 of block 0 of ``kv_cache`` into a ``dtype``
    scratch laid out as :func:`prefill_attention`'s, so that its compilation happens when the
    caller chooses (the PRISM backend: during vLLM's warm-up) and not at a prompt's first
    chunk past context 0, while serving (vLLM's JIT monitor warned of it on the H200). The
    kernel compiles once for every request and chunk of a layout (``do_not_specialize``), so
    one call covers them. Once per (device, layout, dtype): the gathered ``(k, v)`` of that
    position ``[1, nkv, hs]`` the first time, None after."""
    fmt = kv_format(kv_cache, head_size)
    key = (str(kv_cache.device), dataclasses.replace(fmt, num_blocks=0), dtype)
    if key in _GATHER_WARM or fmt.num_blocks < 1:
        return None
    scratch = torch.empty(2, 1, fmt.num_kv_heads, fmt.head_size, dtype=dtype,
                          device=kv_cache.device)
    row = torch.zeros(1, dtype=torch.int32, device=kv_cache.device)
    gather_kv_bf16(kv_cache, row, 0, 1, scratch[0], scratch[1])
    _GATHER_WARM.add(key)
    return scratch[0], scratch[1]


# ----------------------------------------------------------------------- section attention


def _flash_lse(q4: torch.Tensor, k4: torch.Tensor, v4: torch.Tensor, causal: bool,
               scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """torch's flash SDPA with its log-sum-exp; ``[1, H, L, D]`` in, (out, lse [1, H, Lq])."""
    if q4.is_cuda:
        r = torch.ops.aten._scaled_dot_product_flash_attention(
            q4, k4, v4, 0.0, causal, False, scale=scale)
    else:
        r = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q4, k4, v4, 0.0, causal, scale=scale)
    return r[0], r[1][..., :q4.shape[2]]


def _math_lse(q4, k4, v4, causal, scale):
    g = q4.shape[1] // k4.shape[1]
    kf = k4.float().repeat_interleave(g, 1)
    vf = v4.float().repeat_interleave(g, 1)
    s = torch.matmul(q4.float(), kf.transpose(-1, -2)) * scale
    if causal:
        m, n = s.shape[-2:]
        mask = torch.ones(m, n, dtype=torch.bool, device=s.device).tril(n - m)
        s = s.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(s, -1)
    return torch.matmul(torch.softmax(s, -1), vf).to(q4.dtype), lse


@functools.cache
def _native_gqa(device_type: str, device_index: int | None) -> bool:
    """Whether the flash op takes fewer KV heads than query heads (checked once per device)."""
    dev = torch.device(device_type, device_index) if device_index is not None \
        else torch.device(device_type)
    try:
        g = torch.Generator(device=dev).manual_seed(0)
        q = torch.randn(1, 4, 8, 64, device=dev, generator=g).to(torch.bfloat16)
        k = torch.randn(1, 2, 8, 64, device=dev, generator=g).to(torch.bfloat16)
        v = torch.randn(1, 2, 8, 64, device=dev, generator=g).to(torch.bfloat16)
        o, lse = _flash_lse(q, k, v, True, 0.125)
        o2, lse2 = _math_lse(q, k, v, True, 0.125)
        return bool((o.float() - o2.float()).abs().max() < 3e-2
                    and (lse - lse2).abs().max() < 1e-2)
    except Exception:  # noqa: BLE001 - any failure means: expand the heads
        return False


def _merge_into(o_acc: torch.Tensor, lse_acc: torch.Tensor, rows: slice, o: torch.Tensor,
                lse: torch.Tensor) -> None:
    """Log-sum-exp merge of (o [r, H, D], lse [H, r]) into the accumulators' ``rows``."""
    old = lse_acc[:, rows]
    new = torch.logaddexp(old, lse)
    new_safe = torch.where(torch.isinf(new), torch.zeros_like(new), new)
    w_old = torch.exp(old - new_safe).transpose(0, 1).unsqueeze(-1)
    w_new = torch.exp(lse - new_safe).transpose(0, 1).unsqueeze(-1)
    o_acc[rows] = o_acc[rows] * w_old + o.float() * w_new
    lse_acc[:, rows] = new


def _attend_equal_heads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                        scale: float, native: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """[m, Hq, D] x [n, Hk, D]; causal only with m == n."""
    m, hq, dd = q.shape
    n, hk, _ = k.shape
    g = hq // hk
    if native or g == 1:
        o, lse = _flash_lse(q.transpose(0, 1).unsqueeze(0), k.transpose(0, 1).unsqueeze(0),
                            v.transpose(0, 1).unsqueeze(0), causal, scale)
        return o[0].transpose(0, 1), lse[0]
    if not causal:
        # Fold the GQA group into the rows: row t * g + j is query head kvh * g + j.
        qf = q.reshape(m, hk, g, dd).permute(1, 0, 2, 3).reshape(1, hk, m * g, dd)
        o, lse = _flash_lse(qf, k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0),
                            False, scale)
        o = o[0].reshape(hk, m, g, dd).permute(1, 0, 2, 3).reshape(m, hq, dd)
        lse = lse[0].reshape(hk, m, g).permute(0, 2, 1).reshape(hq, m)
        return o, lse
    ke = k.repeat_interleave(g, 1).transpose(0, 1).unsqueeze(0)
    ve = v.repeat_interleave(g, 1).transpose(0, 1).unsqueeze(0)
    o, lse = _flash_lse(q.transpose(0, 1).unsqueeze(0), ke, ve, True, scale)
    return o[0].transpose(0, 1), lse[0]


def sdpa_section_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                           scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Default section attention on torch's flash SDPA (see module docstring for the
    contract). Causal is bottom-right aligned: row ``i`` sees keys ``<= i + n - m``."""
    m, n = q.shape[0], k.shape[0]
    native = NATIVE_GQA if NATIVE_GQA is not None else _native_gqa(q.device.type,
                                                                     q.device.index)
    if not causal:
        return _attend_equal_heads(q, k, v, False, scale, native)
    if n < m:
        raise ValueError("causal section attention needs at least as many keys as queries")
    off = n - m
    if native or m <= SQUARE_ROWS:
        if off == 0:  # a prompt at context 0: one causal call, no merge
            return _attend_equal_heads(q, k, v, True, scale, native)
        blocks = [(0, m)]
    else:
        blocks = [(a, min(m, a + SQUARE_ROWS)) for a in range(0, m, SQUARE_ROWS)]
    o_acc = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    lse_acc = torch.full((q.shape[1], m), float("-inf"), device=q.device)
    for a, b in blocks:
        rows = slice(a, b)
        if off + a > 0:
            o, lse = _attend_equal_heads(q[a:b], k[:off + a], v[:off + a], False, scale, native)
            _merge_into(o_acc, lse_acc, rows, o, lse)
        o, lse = _attend_equal_heads(q[a:b], k[off + a:off + b], v[off + a:off + b], True,
                                     scale, native)
        _merge_into(o_acc, lse_acc, rows, o, lse)
    return o_acc, lse_acc


# ---------------------------------------------------------------------------------- prefill


def section_tokens_for(num_kv_heads: int, head_size: int,
                       budget_bytes: int = SCRATCH_BYTES) -> int:
    """Largest section (<= 32K tokens) whose BF16 K and V fit the scratch budget."""
    per_token = num_kv_heads * head_size * 2 * 2
    return max(16, min(MAX_SECTION_TOKENS, budget_bytes // per_token))


def prefill_attention(q: torch.Tensor, kv_cache: torch.Tensor, md: AttentionMetadata, *,
                      scale: float | None = None, out: torch.Tensor | None = None,
                      req_ids: Sequence[int] | None = None,
                      attn_fn: SectionAttention | None = None,
                      section_tokens: int | None = None,
                      scratch: torch.Tensor | None = None,
                      fresh: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """Causal attention of each selected request's query chunk over its cached context and
    itself (eager: reads the host copies of the metadata). ``scratch`` (``[2, S, nkv, hs]`` in
    q's dtype) can be shared between layers; otherwise one is allocated for this call.
    ``fresh``: the step's own K and V (``[num_tokens, nkv, hs]``, q's rows); a request whose
    chunk is its whole sequence (context 0) attends to them directly, one causal call, instead
    of reading its cache back (no gather, and the K / V before any INT8 rounding)."""
    fmt = kv_format(kv_cache, q.shape[-1])
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    attn_fn = attn_fn or sdpa_section_attention
    if out is None:
        out = torch.empty_like(q)
    out3 = out.view(q.shape)
    qsl, sls = md.host()
    reqs = list(range(md.num_reqs)) if req_ids is None else list(req_ids)
    if not reqs:
        return out
    sec = section_tokens or section_tokens_for(fmt.num_kv_heads, fmt.head_size)
    if fresh is not None:  # chunks at context 0: their own K / V, then the rest from the cache
        at_0 = [r for r in reqs if sls[r] == qsl[r + 1] - qsl[r] > 0]
        for r in at_0:
            a, b = qsl[r], qsl[r + 1]
            o, _ = attn_fn(q[a:b], fresh[0][a:b].to(q.dtype), fresh[1][a:b].to(q.dtype), True,
                           scale)
            out3[a:b] = o.to(out3.dtype)
        reqs = [r for r in reqs if r not in at_0]
        if not reqs:
            return out
    need = min(sec, max(sls[r] for r in reqs))
    if scratch is None or scratch.shape[1] < need:
        scratch = torch.empty(2, need, fmt.num_kv_heads, fmt.head_size, dtype=q.dtype,
                              device=q.device)
    sec = min(sec, scratch.shape[1])
    hq = q.shape[1]
    for r in reqs:
        a, b = qsl[r], qsl[r + 1]
        m = b - a
        if m == 0:
            continue
        seq_len = sls[r]
        c = seq_len - m
        qr = q[a:b]
        if seq_len <= sec:
            # One section (every prompt up to 32K): one causal call straight into the output,
            # no fp32 accumulators and no merge.
            k_s, v_s = scratch[0, :seq_len], scratch[1, :seq_len]
            gather_kv_bf16(kv_cache, md.block_table[r], 0, seq_len, k_s, v_s)
            o, _ = attn_fn(qr, k_s, v_s, True, scale)
            out3[a:b] = o.to(out3.dtype)
            continue
        o_acc = torch.zeros(m, hq, fmt.head_size, dtype=torch.float32, device=q.device)
        lse_acc = torch.full((hq, m), float("-inf"), dtype=torch.float32, device=q.device)
        for s0 in range(0, seq_len, sec):
            s1 = min(seq_len, s0 + sec)
            t_lo = max(0, s0 - c)  # rows at positions >= s0 see part of this section
            if t_lo >= m:
                break
            n = s1 - s0
            k_s, v_s = scratch[0, :n], scratch[1, :n]
            gather_kv_bf16(kv_cache, md.block_table[r], s0, n, k_s, v_s)
            t_full = min(m, max(t_lo, s1 - 1 - c))  # rows from here see the whole section
            if t_full > t_lo:
                kend = c + t_full - s0
                o, lse = attn_fn(qr[t_lo:t_full], k_s[:kend], v_s[:kend], True, scale)
                _merge_into(o_acc, lse_acc, slice(t_lo, t_full), o, lse)
            if t_full < m:
                o, lse = attn_fn(qr[t_full:], k_s, v_s, False, scale)
                _merge_into(o_acc, lse_acc, slice(t_full, m), o, lse)
        out3[a:b] = o_acc.to(out3.dtype)
    return out
