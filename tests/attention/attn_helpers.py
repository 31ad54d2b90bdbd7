"""Batches for the attention tests: a paged cache filled the way vLLM fills it, block tables
with holes (shuffled, non-contiguous block ids, unused blocks poisoned), random queries."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vllm_prism.attention.ops import AttentionMetadata, make_kv_cache, write_kv

HS, HKV, GROUP = 256, 4, 6


@dataclass
class Batch:
    q: torch.Tensor
    cache: torch.Tensor
    md: AttentionMetadata
    block_table: torch.Tensor
    seq_lens: list[int]
    query_lens: list[int]


def make_batch(seq_lens: list[int], query_lens: list[int], dtype: torch.dtype, *,
               block_size: int = 16, layout: str = "NHD", head_size: int = HS,
               num_kv_heads: int = HKV, group: int = GROUP, device: str = "cpu",
               q_dtype: torch.dtype = torch.bfloat16, q_gain: float = 2.0,
               seed: int = 0, spare_blocks: int = 7) -> Batch:
    g = torch.Generator(device="cpu").manual_seed(seed)
    gd = torch.Generator(device=device).manual_seed(seed)
    nbs = [-(-s // block_size) for s in seq_lens]
    num_blocks = sum(nbs) + spare_blocks
    cache = make_kv_cache(num_blocks, num_kv_heads, block_size, head_size, dtype, layout,
                          device)
    # Poison every byte: blocks a kernel must not read (and the unused tail of the last
    # partial block) hold NaN (float caches) or NaN scales (INT8).
    if dtype == torch.int8:
        cache.fill_(-1)  # 0xFF bytes: int8 -1, scale 0xFFFFFFFF = NaN
    else:
        cache.fill_(float("nan"))
    perm = torch.randperm(num_blocks, generator=g)
    bt = torch.zeros(len(seq_lens), max(nbs) + 2, dtype=torch.int32)
    i = 0
    for r, (s, nb) in enumerate(zip(seq_lens, nbs)):
        bt[r, :nb] = perm[i:i + nb].to(torch.int32)
        i += nb
        pos = torch.arange(s)
        slots = bt[r][pos // block_size].long() * block_size + pos % block_size
        k = torch.randn(s, num_kv_heads, head_size, generator=gd, device=device)
        v = torch.randn(s, num_kv_heads, head_size, generator=gd, device=device)
        # a few large channels, as real keys have
        k[..., :4] *= 4.0
        write_kv(cache, k, v, slots.to(device))
    md = AttentionMetadata.build(bt.to(device), seq_lens, query_lens)
    q = (torch.randn(sum(query_lens), num_kv_heads * group, head_size, generator=gd,
                     device=device) * q_gain).to(q_dtype)
    return Batch(q, cache, md, bt.to(device), seq_lens, query_lens)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out = out.float()
    if not torch.isfinite(out).all():
        return float("inf")
    return ((out - ref).norm() / ref.norm()).item()


def poisoned_out(q: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    return torch.full(q.shape, float("nan"), dtype=dtype or q.dtype, device=q.device)
