"""Attention kernels over vLLM 0.32's paged KV cache, BF16 or ``int8_per_token_head``.

Free of vLLM imports, so a backend class can wrap them and CPU tests can run them under the
Triton interpreter. The cache is the logical ``(num_blocks, num_kv_heads, block_size, content)``
tensor vLLM hands to TRITON_ATTN (see :mod:`.layout`); its dtype picks the kernel variant.

* :func:`decode_attention` - one query token per request: split-KV over segments of the
  context, merged by log-sum-exp (graph-safe; geometry per GPU in :mod:`.geometry`); on an
  INT8 cache the CUDA C++ kernel of :mod:`.cuda_decode` where ``vllm_prism._C`` is built.
* :func:`verify_attention` - 2..16 query tokens per request: prefix through the split path with
  the tokens folded into the GQA group, plus an exact causal tail, merged by log-sum-exp.
* :func:`noncausal_attention` - 1..16 query tokens per request, each against the whole
  sequence (a DFlash drafter's non-causal block): the split path without a tail.
* :func:`prefill_attention` - long chunks: cached K/V converted in sections of <= 32K tokens
  into one reusable BF16 scratch (<= 128 MiB), flash attention per section (a hook), merged by
  log-sum-exp.
* :func:`mixed_attention` - a batch mixing the three, routed per request (``causal=False``:
  decode and non-causal blocks only).
* :func:`reference_attention` - the fp32 torch reference on the dequantised cache.
"""

from vllm_prism.attention.ops.geometry import GpuGeometry, SplitGeometry, gpu_geometry
from vllm_prism.attention.ops.layout import (KVFormat, kv_format, make_kv_cache,
                                             quantize_per_token_head, write_kv)
from vllm_prism.attention.ops.metadata import AttentionMetadata
from vllm_prism.attention.ops.mixed import mixed_attention, route_requests
from vllm_prism.attention.ops.prefill import (SectionAttention, prefill_attention,
                                              sdpa_section_attention)
from vllm_prism.attention.ops.reference import reference_attention
from vllm_prism.attention.ops.triton_split_kv import (MAX_VERIFY_TOKENS, decode_attention,
                                                      noncausal_attention, verify_attention)

__all__ = ["AttentionMetadata", "GpuGeometry", "KVFormat", "MAX_VERIFY_TOKENS",
           "SectionAttention", "SplitGeometry", "decode_attention", "gpu_geometry", "kv_format",
           "make_kv_cache", "mixed_attention", "noncausal_attention", "prefill_attention",
           "quantize_per_token_head", "reference_attention", "route_requests",
           "sdpa_section_attention", "verify_attention", "write_kv"]
