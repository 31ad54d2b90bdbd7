"""Batches for the attention tests: a paged cache filled the way vLLM fills it, block tables
with holes (shuffled, non-contiguous block ids, unused blocks poisoned), random queries."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import pytest
import torch

from vllm_prism.attention.ops import AttentionMetadata, make_kv_cache, write_kv

HS, HKV, GROUP = 256, 4, 6
# A kernel still running after this long has hung (a broken mbarrier ring does): the test fails
# by name and the run ends after pytest's report (tests/conftest.py, GPU_HUNG_ENV), instead of
# waiting for the device call's timeout with nothing said.
HANG_SECONDS = 60.0
GPU_HUNG_ENV = "PRISM_GPU_HUNG"


def synchronize_or_fail(what: str, seconds: float | None = None) -> None:
    """Waits for the GPU work queued so far on the current stream, failing the test (by
    ``what``, the call's description) where it has not finished after HANG_SECONDS."""
    limit = HANG_SECONDS if seconds is None else seconds
    done = torch.cuda.Event()
    done.record()
    start = time.monotonic()
    while not done.query():
        if time.monotonic() - start > limit:
            os.environ[GPU_HUNG_ENV] = what
            pytest.fail(f"the GPU has not finished after {limit:g} s (a hung kernel): {what}; "
                        "this run ends after the report")
        time.sleep(0.002)


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


def causal_fp32(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """fp32 causal attention of q [m, Hq, hs] over k, v [m, Hkv, hs] (head h reads KV head
    h // group), written out here independently of the kernels."""
    g = q.shape[1] // k.shape[1]
    kf = k.float().repeat_interleave(g, 1).transpose(0, 1)  # [Hq, m, hs]
    vf = v.float().repeat_interleave(g, 1).transpose(0, 1)
    s = torch.einsum("qhd,hkd->hqk", q.float(), kf) / q.shape[-1] ** 0.5
    m = q.shape[0]
    s = s.masked_fill(torch.ones(m, m, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.einsum("hqk,hkd->qhd", torch.softmax(s, -1), vf)


def with_fresh_rows(ref: torch.Tensor, b, k_new: torch.Tensor, v_new: torch.Tensor,
                    reqs: list[int]) -> torch.Tensor:
    """``ref`` with the rows of requests ``reqs`` (chunks at context 0) replaced by causal
    attention over the step's own K / V rows ``k_new``, ``v_new``."""
    qsl = b.md.query_start_loc_cpu.tolist()
    for r in reqs:
        rows = slice(qsl[r], qsl[r + 1])
        ref[rows] = causal_fp32(b.q[rows], k_new[rows], v_new[rows])
    return ref
