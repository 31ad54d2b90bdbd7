"""Run the PRISM backend's forward (vLLM's Triton-backend metadata in, our kernels under
the Triton interpreter) on a mixed batch and print its error against the fp32 reference.

Run by test_prism_backend.py in a subprocess with TRITON_INTERPRET=1.
"""

from __future__ import annotations

import json
import types

import torch
import os

from attn_helpers import causal_fp32, make_batch, rel_err
from vllm.v1.attention.backend import AttentionType

from vllm_prism.attention.backends.prism_attn import PrismAttentionImpl, prism_metadata
from vllm_prism.attention.ops.mixed import StepPlan
from vllm_prism.attention.ops.reference import reference_attention


def triton_metadata(batch, num_reqs: int, padded_tokens: int):
    """What TritonAttentionMetadataBuilder + our build() produce, with padded buffers."""
    qsl = batch.md.query_start_loc_cpu
    pad = 3  # persistent buffers are longer than the batch
    md = types.SimpleNamespace(
        num_actual_tokens=int(qsl[-1]), max_query_len=max(batch.query_lens),
        query_start_loc=torch.cat([qsl, qsl[-1:].repeat(pad)]),
        max_seq_len=max(batch.seq_lens),
        seq_lens=torch.cat([batch.md.seq_lens, torch.zeros(pad, dtype=torch.int32)]),
        block_table=torch.cat([batch.block_table,
                               torch.zeros(pad, batch.block_table.shape[1], dtype=torch.int32)]),
    )
    # what PrismAttentionMetadataBuilder.build attaches
    md.prism = prism_metadata(md, num_reqs, torch.cat([qsl, qsl[-1:].repeat(pad)]))
    md.prism_plan = StepPlan.build(md.prism.query_lens(), torch.device("cpu"),
                                   ids_buffer=torch.full((2, num_reqs + pad), -1,
                                                         dtype=torch.int32))
    return md


def impl_for(kv_dtype: str, head_size: int) -> PrismAttentionImpl:
    impl = object.__new__(PrismAttentionImpl)
    impl.attn_type = AttentionType.DECODER
    impl.kv_cache_dtype = kv_dtype
    impl.alibi_slopes = None
    impl.sinks = None
    impl.sliding_window = (-1, -1)
    impl.logits_soft_cap = 0
    impl.scale = head_size ** -0.5
    impl._is_per_token_head_quant = kv_dtype == "int8_per_token_head"
    impl._k_scale_cache = impl._v_scale_cache = None
    return impl


def check(kv_dtype: str, cache_dtype: torch.dtype, causal: bool = True) -> float:
    """A causal step mixing decode, verification and prefill; or a non-causal step (a DFlash
    drafter's: 6-token blocks, and one request decoding)."""
    if causal:  # decode, verify, prefill, decode
        seq_lens, query_lens = [37, 70, 150, 21], [1, 5, 40, 1]
    else:
        seq_lens, query_lens = [37, 70, 150, 21], [6, 6, 1, 6]
    batch = make_batch(seq_lens, query_lens, cache_dtype, block_size=16)
    hs = batch.q.shape[-1]
    md = triton_metadata(batch, len(seq_lens), batch.q.shape[0])
    md.causal = causal
    out = torch.full((batch.q.shape[0] + 2, *batch.q.shape[1:]), float("nan"),
                     dtype=batch.q.dtype)
    q = torch.cat([batch.q, torch.zeros(2, *batch.q.shape[1:], dtype=batch.q.dtype)])
    impl_for(kv_dtype, hs).forward(None, q, None, None, batch.cache, md, out)
    ref = reference_attention(batch.q, batch.cache, batch.block_table, seq_lens,
                              batch.md.query_start_loc_cpu, causal=causal)
    n = batch.q.shape[0]
    assert torch.isnan(out[n:]).all(), "wrote past num_actual_tokens"
    return rel_err(out[:n], ref)


def check_fresh(kv_dtype: str, cache_dtype: torch.dtype) -> dict:
    """A step with a prefill chunk at context 0 (request 1) among decode and mid-context
    prefill requests, with the step's K and V passed as vLLM passes them (rows of q, padded):
    request 1 attends to them (they differ from its cache here), the others read the cache;
    with VLLM_PRISM_PREFILL_FRESH_KV=0 request 1 reads its cache too."""
    seq_lens, query_lens = [37, 40, 150, 21], [1, 40, 40, 1]
    batch = make_batch(seq_lens, query_lens, cache_dtype, block_size=16, seed=9)
    hs, n = batch.q.shape[-1], batch.q.shape[0]
    md = triton_metadata(batch, len(seq_lens), n)
    md.causal = True
    g = torch.Generator().manual_seed(10)
    shape = (n + 2, batch.cache.shape[1], hs)
    key = torch.randn(shape, generator=g).to(batch.q.dtype)
    value = torch.randn(shape, generator=g).to(batch.q.dtype)
    q = torch.cat([batch.q, torch.zeros(2, *batch.q.shape[1:], dtype=batch.q.dtype)])
    outs = {}
    for flag in ("0", "1"):
        os.environ["VLLM_PRISM_PREFILL_FRESH_KV"] = flag
        outs[flag] = torch.full((n + 2, *batch.q.shape[1:]), float("nan"), dtype=batch.q.dtype)
        impl_for(kv_dtype, hs).forward(None, q, key, value, batch.cache, md, outs[flag])
    os.environ.pop("VLLM_PRISM_PREFILL_FRESH_KV")
    # after the forward, as in check(): an INT8 cache's scale views are set up by it
    cache_ref = reference_attention(batch.q, batch.cache, batch.block_table, seq_lens,
                                    batch.md.query_start_loc_cpu)
    ref = cache_ref.clone()
    rows = slice(1, 41)
    ref[rows] = causal_fp32(batch.q[rows], key[rows], value[rows])
    return {"1": rel_err(outs["1"][:n], ref), "0": rel_err(outs["0"][:n], cache_ref),
            "fresh_vs_cache_reference": rel_err(ref, cache_ref)}


if __name__ == "__main__":
    print(json.dumps({"int8": check("int8_per_token_head", torch.int8),
                      "bf16": check("auto", torch.bfloat16),
                      "int8_noncausal": check("int8_per_token_head", torch.int8, causal=False),
                      "bf16_noncausal": check("auto", torch.bfloat16, causal=False),
                      "int8_fresh": check_fresh("int8_per_token_head", torch.int8),
                      "bf16_fresh": check_fresh("auto", torch.bfloat16)}))
