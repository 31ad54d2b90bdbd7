"""Pure-torch fp32 reference for attention over the paged cache (tests and benchmarks).

It shares no code with the kernels: it reads the logical cache ``(num_blocks, num_kv_heads,
block_size, content)`` by plain indexing and dequantises an INT8 row as
``int8[0:hs] * float32(bytes[hs:hs+4])`` for K and ``int8[hs+4:2hs+4] * float32(bytes[2hs+4:])``
for V (vLLM 0.32's ``int8_per_token_head`` content, see :mod:`.layout`); a BF16/FP16 row is
``[K(hs) | V(hs)]``. Query token ``t`` of a request with ``q_len`` query tokens and ``seq_len``
tokens sits at position ``seq_len - q_len + t`` and attends to positions ``0..`` that (all
``seq_len`` positions when not causal).
"""

from __future__ import annotations

import math

import torch

__all__ = ["gather_dequantized", "reference_attention"]


def gather_dequantized(kv_cache: torch.Tensor, block_row: torch.Tensor, seq_len: int,
                       head_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """K, V of positions ``0..seq_len-1`` of one request as fp32 ``[seq_len, nkv, hs]``."""
    bs = kv_cache.shape[2]
    pos = torch.arange(seq_len, device=kv_cache.device)
    blocks = block_row.long()[pos // bs]
    rows = kv_cache[blocks, :, pos % bs]  # [seq_len, nkv, content]
    hs = head_size
    if kv_cache.dtype == torch.int8:
        k = rows[..., :hs].float()
        v = rows[..., hs + 4:2 * hs + 4].float()
        ks = rows[..., hs:hs + 4].contiguous().view(torch.float32)  # [seq, nkv, 1]
        vs = rows[..., 2 * hs + 4:2 * hs + 8].contiguous().view(torch.float32)
        return k * ks, v * vs
    return rows[..., :hs].float(), rows[..., hs:2 * hs].float()


def reference_attention(q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
                        seq_lens: list[int] | torch.Tensor,
                        query_start_loc: list[int] | torch.Tensor,
                        scale: float | None = None, causal: bool = True) -> torch.Tensor:
    """fp32 attention of every query token of ``q [T, Hq, hs]``; returns fp32 ``[T, Hq, hs]``.
    ``causal=False``: every query token attends to all ``seq_len`` positions of its request
    (a DFlash drafter's block)."""
    if isinstance(seq_lens, torch.Tensor):
        seq_lens = seq_lens.tolist()
    if isinstance(query_start_loc, torch.Tensor):
        query_start_loc = query_start_loc.tolist()
    hs = q.shape[-1]
    nq = q.shape[1]
    nkv = kv_cache.shape[1]
    group = nq // nkv
    scale = 1.0 / math.sqrt(hs) if scale is None else scale
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    for r, seq_len in enumerate(seq_lens):
        a, b = query_start_loc[r], query_start_loc[r + 1]
        qlen = b - a
        if qlen == 0:
            continue
        k, v = gather_dequantized(kv_cache, block_table[r], seq_len, hs)
        k = k.transpose(0, 1)  # [nkv, L, hs]
        v = v.transpose(0, 1)
        qr = q[a:b].float().view(qlen, nkv, group, hs).permute(1, 2, 0, 3)  # [nkv, G, q, hs]
        s = torch.einsum("hgqd,hld->hgql", qr, k) * scale
        qpos = torch.arange(seq_len - qlen, seq_len, device=q.device)
        kpos = torch.arange(seq_len, device=q.device)
        if causal:
            s = s.masked_fill(kpos[None, None, None, :] > qpos[None, None, :, None],
                              float("-inf"))
        p = torch.softmax(s, dim=-1)
        o = torch.einsum("hgql,hld->hgqd", p, v)
        out[a:b] = o.permute(2, 0, 1, 3).reshape(qlen, nq, hs)
    return out
