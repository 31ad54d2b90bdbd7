"""One attention call for a whole step: decode, verification and prefill requests mixed.

Requests are routed by their number of query tokens in this step: 1 -> split-KV decode,
2..``verify_max`` -> split-KV verification (prefix split + exact causal tail), longer ->
prefill from the cache in bounded sections. Any order of requests works: the split kernels take
the list of request indices and write their output rows in place, so nothing is gathered or
reordered. Routing reads the host copy of ``query_start_loc`` (eager steps; a pure-decode or
pure-verification step under a CUDA graph calls :func:`decode_attention` /
:func:`verify_attention` directly).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from vllm_prism.attention.ops.geometry import GpuGeometry
from vllm_prism.attention.ops.metadata import AttentionMetadata
from vllm_prism.attention.ops.prefill import SectionAttention, prefill_attention
from vllm_prism.attention.ops.triton_split_kv import (MAX_VERIFY_TOKENS, decode_attention,
                                                      verify_attention)

__all__ = ["route_requests", "mixed_attention"]


def route_requests(query_lens: Sequence[int], verify_max: int = MAX_VERIFY_TOKENS
                   ) -> tuple[list[int], list[int], list[int]]:
    """(decode, verify, prefill) request indices."""
    dec, ver, pre = [], [], []
    for i, n in enumerate(query_lens):
        if n == 1:
            dec.append(i)
        elif 2 <= n <= verify_max:
            ver.append(i)
        elif n > verify_max:
            pre.append(i)
    return dec, ver, pre


def mixed_attention(q: torch.Tensor, kv_cache: torch.Tensor, md: AttentionMetadata, *,
                    scale: float | None = None, out: torch.Tensor | None = None,
                    int_qk: bool = False, verify_max: int = MAX_VERIFY_TOKENS,
                    attn_fn: SectionAttention | None = None,
                    scratch: torch.Tensor | None = None,
                    geometry: GpuGeometry | None = None) -> torch.Tensor:
    """Attention for every query token of a batch that mixes decode, verification and prefill
    requests; ``q`` and ``out`` are ``[num_tokens, num_heads, head_size]``."""
    if out is None:
        out = torch.empty_like(q)
    qlens = md.query_lens()
    dec, ver, pre = route_requests(qlens, min(verify_max, MAX_VERIFY_TOKENS))
    is_int8 = kv_cache.dtype == torch.int8
    if dec:
        ids = torch.tensor(dec, dtype=torch.int32).to(q.device, non_blocking=True)
        decode_attention(q, kv_cache, md, scale=scale, out=out, req_ids=ids, int_qk=int_qk,
                         geometry=geometry.pick(False, is_int8) if geometry else None)
    if ver:
        ids = torch.tensor(ver, dtype=torch.int32).to(q.device, non_blocking=True)
        verify_attention(q, kv_cache, md, scale=scale, out=out, req_ids=ids,
                         max_query_len=max(qlens[i] for i in ver),
                         geometry=geometry.pick(True, is_int8) if geometry else None)
    if pre:
        prefill_attention(q, kv_cache, md, scale=scale, out=out, req_ids=pre, attn_fn=attn_fn,
                          scratch=scratch)
    return out
