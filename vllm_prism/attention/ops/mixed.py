"""One attention call for a whole step: decode, verification and prefill requests mixed.

Requests are routed by their number of query tokens in this step: 1 -> split-KV decode,
2..``verify_max`` -> split-KV verification (prefix split + exact causal tail), longer ->
prefill from the cache in bounded sections. Any order of requests works: the split kernels take
the list of request indices and write their output rows in place, so nothing is gathered or
reordered.

The routing is a :class:`StepPlan`, made once per step from the host copy of
``query_start_loc`` (the backend's metadata builder does it, outside any CUDA graph) and shared
by every layer. A uniform step (every request decoding, or every request verifying the same
number of tokens) runs the split kernel over all requests with no index tensor, so its launch
depends only on the batch shape: what a full CUDA graph captures stays valid at replay. Mixed
steps pass index tensors the plan filled once for the step (into caller-owned persistent
buffers when given).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from vllm_prism.attention.ops.geometry import GpuGeometry
from vllm_prism.attention.ops.metadata import AttentionMetadata
from vllm_prism.attention.ops.prefill import SectionAttention, prefill_attention
from vllm_prism.attention.ops.triton_split_kv import (MAX_VERIFY_TOKENS, decode_attention,
                                                      noncausal_attention, verify_attention)

__all__ = ["route_requests", "mixed_attention", "StepPlan"]


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


@dataclass
class StepPlan:
    """The routing of one step: request indices per path, and their device copies.

    ``decode_ids`` / ``verify_ids`` are None when the path takes every request of the batch
    (uniform steps), else int32 device tensors. ``verify_len`` is the widest verification
    request (the kernel's static row count).
    """

    decode: list[int]
    verify: list[int]
    prefill: list[int]
    decode_ids: torch.Tensor | None = None
    verify_ids: torch.Tensor | None = None
    verify_len: int = 0

    @classmethod
    def build(cls, query_lens: Sequence[int], device: torch.device, *,
              verify_max: int = MAX_VERIFY_TOKENS,
              ids_buffer: torch.Tensor | None = None) -> StepPlan:
        """Route ``query_lens``; ``ids_buffer`` (int32 ``[2, >= num_reqs]`` on ``device``)
        receives the index lists of a mixed step, so their addresses never change."""
        dec, ver, pre = route_requests(query_lens, min(verify_max, MAX_VERIFY_TOKENS))
        n = len(query_lens)
        plan = cls(dec, ver, pre, verify_len=max((query_lens[i] for i in ver), default=0))
        if dec and len(dec) < n:
            plan.decode_ids = _device_ids(dec, device, None if ids_buffer is None
                                          else ids_buffer[0])
        if ver and len(ver) < n:
            plan.verify_ids = _device_ids(ver, device, None if ids_buffer is None
                                          else ids_buffer[1])
        return plan


def _device_ids(ids: list[int], device: torch.device, buf: torch.Tensor | None
                ) -> torch.Tensor:
    # Pinned on CUDA: a copy from pageable memory synchronizes the stream first, which would
    # stall the builder of a mixed step until the GPU finished the previous step (torch's
    # pinned allocator keeps the block until the asynchronous copy has run).
    pinned = device.type == "cuda"
    host = torch.tensor(ids, dtype=torch.int32, pin_memory=pinned)
    if buf is None:
        return host.to(device, non_blocking=True)
    view = buf[:len(ids)]
    view.copy_(host, non_blocking=pinned)
    return view


def mixed_attention(q: torch.Tensor, kv_cache: torch.Tensor, md: AttentionMetadata, *,
                    scale: float | None = None, out: torch.Tensor | None = None,
                    int_qk: bool = False, verify_max: int = MAX_VERIFY_TOKENS,
                    attn_fn: SectionAttention | None = None,
                    scratch: torch.Tensor | None = None,
                    geometry: GpuGeometry | None = None,
                    plan: StepPlan | None = None, causal: bool = True,
                    fresh: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """Attention for every query token of a batch that mixes decode, verification and prefill
    requests; ``q`` and ``out`` are ``[num_tokens, num_heads, head_size]``. ``plan`` is the
    step's routing (made here from the host copy of the metadata when not given).
    ``causal=False`` (a DFlash drafter's block): every query token attends to its request's
    whole sequence; requests of 2..``verify_max`` tokens go through
    :func:`noncausal_attention`, and longer ones are refused (no non-causal prefill path).
    ``fresh``: the step's own K and V for prefill chunks at context 0
    (:func:`prefill_attention`)."""
    if out is None:
        out = torch.empty_like(q)
    if plan is None:
        plan = StepPlan.build(md.query_lens(), q.device, verify_max=verify_max)
    if not causal and plan.prefill:
        raise ValueError(f"non-causal attention takes at most {MAX_VERIFY_TOKENS} query tokens "
                         f"a request; requests {plan.prefill} have more")
    is_int8 = kv_cache.dtype == torch.int8
    if plan.decode:
        decode_attention(q, kv_cache, md, scale=scale, out=out, req_ids=plan.decode_ids,
                         int_qk=int_qk,
                         geometry=geometry.pick(False, is_int8) if geometry else None)
    if plan.verify:
        blocks = verify_attention if causal else noncausal_attention
        blocks(q, kv_cache, md, scale=scale, out=out, req_ids=plan.verify_ids,
               max_query_len=plan.verify_len,
               geometry=geometry.pick(True, is_int8) if geometry else None)
    if plan.prefill:
        prefill_attention(q, kv_cache, md, scale=scale, out=out, req_ids=plan.prefill,
                          attn_fn=attn_fn, scratch=scratch, fresh=fresh)
    return out
