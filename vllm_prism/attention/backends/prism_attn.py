"""The PRISM attention backend: vLLM's Triton backend with our split-KV kernels.

It keeps everything of vLLM 0.32's Triton backend that concerns the cache (the page layout,
the per-token-head INT8 layout with its inline fp32 scales, the cache writer, the metadata
builder) and replaces the attention itself with vllm_prism.attention.ops: split-KV decode,
split verification (prefix through the split path + causal tail, merged by log-sum-exp),
non-causal draft blocks (a DFlash drafter's) through the split path without a tail, prefill
from the cache in bounded sections, and mixed batches routed per request. The same
kernels serve the BF16/FP16 cache and ``--kv-cache-dtype int8_per_token_head``.

Calls the kernels cannot take (encoder attention, ALiBi, sinks, sliding windows, soft-cap,
fused output quantization, other cache dtypes) go to the Triton backend unchanged.

CUDA graphs: the builder routes each step once (a :class:`StepPlan` from the host copy of
``query_start_loc``, index lists in persistent buffers), so the forward reads nothing on the
host. Uniform steps (all decode, or all verifying k+1 tokens) launch the split kernel over the
whole batch with a grid fixed by the batch shape, which is what full graphs need
(``AttentionCGSupport.UNIFORM_BATCH``: vLLM's default FULL_AND_PIECEWISE mode captures them
whole); mixed and prefill steps run eagerly between piecewise graphs.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from vllm.logger import init_logger
from vllm.v1.attention.backend import AttentionCGSupport, AttentionType
from vllm.v1.attention.backends.triton_attn import (TritonAttentionBackend,
                                                    TritonAttentionImpl,
                                                    TritonAttentionMetadataBuilder)

from vllm_prism import envs
from vllm_prism.attention.ops.metadata import AttentionMetadata as PrismMetadata
from vllm_prism.attention.ops.mixed import StepPlan, mixed_attention
from vllm_prism.attention.ops.prefill import warm_gather_kv
from vllm_prism.attention.ops.triton_split_kv import MAX_VERIFY_TOKENS

logger = init_logger(__name__)

BACKEND_NAME = "PRISM"
SUPPORTED_KV_DTYPES = ("auto", "bfloat16", "float16", "int8_per_token_head")


class PrismAttentionMetadataBuilder(TritonAttentionMetadataBuilder):
    """Triton metadata plus our kernels' view of it and the step's routing, built once per
    step and shared by every layer."""

    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.UNIFORM_BATCH

    def __init__(self, kv_cache_spec: Any, layer_names: list[str], vllm_config: Any,
                 device: torch.device) -> None:
        # The Triton __init__ above sets supports_draft_decode_metadata_update (True without
        # an R-SWA window): a speculator may then replay a FULL-graph draft step without
        # build(), refreshing the metadata in place (Triton's no-op). That holds for us too:
        # our kernels read only the persistent device buffers the Triton metadata views, a
        # replay runs no Python (the plan made at capture, a uniform step's, has no index
        # lists), and eager and piecewise steps are always built. (Until 2026-12-05 a class
        # attribute here said False; that instance attribute overrode it, so the GPU DFlash
        # tests ran as now.)
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        max_reqs = vllm_config.scheduler_config.max_num_seqs
        # Index lists of mixed steps: fixed addresses, filled once per step.
        self.prism_ids = torch.zeros(2, max_reqs, dtype=torch.int32, device=device)

    def build(self, common_prefix_len: int, common_attn_metadata: Any,
              fast_build: bool = False) -> Any:
        md = super().build(common_prefix_len, common_attn_metadata, fast_build)
        md.prism = prism_metadata(
            md, common_attn_metadata.num_reqs, common_attn_metadata.query_start_loc_cpu,
            getattr(common_attn_metadata, "seq_lens_cpu_upper_bound", None))
        md.prism_plan = plan = StepPlan.build(md.prism.query_lens(),
                                              md.query_start_loc.device,
                                              ids_buffer=self.prism_ids)
        _log_route(plan, causal=getattr(common_attn_metadata, "causal", True) is True)
        return md


def _log_route(plan: StepPlan, causal: bool = True) -> None:
    """Say once per kind of step which attention path serves it (host side, in the builder)."""
    if not causal:
        if plan.prefill:
            logger.info_once("PRISM attention: non-causal chunks of more than %d tokens a "
                             "request run vLLM's Triton attention", MAX_VERIFY_TOKENS)
        else:
            logger.info_once("PRISM attention: non-causal draft blocks run the split-KV path "
                             "over the whole sequence")
        return
    if plan.verify:
        # once, not once per width: vLLM's capture and warm-up run every width up to k + 1
        logger.info_once("PRISM attention: verification steps (2 to %d query tokens a "
                         "request) run the split verification path (prefix by split-KV, causal "
                         "tail, merged by log-sum-exp)", MAX_VERIFY_TOKENS)
    if plan.decode:
        logger.info_once("PRISM attention: decode steps run the split-KV decode kernel")
    if plan.prefill:
        logger.info_once("PRISM attention: prefill runs in bounded sections")


def prism_metadata(md: Any, num_reqs: int, query_start_loc_cpu: torch.Tensor,
                   seq_lens_cpu: torch.Tensor | None = None) -> PrismMetadata:
    """Our kernels' metadata from the Triton backend's (views, no copies).

    ``seq_lens_cpu`` is vLLM's host upper bound on the sequence lengths, exact for prefill
    requests: the prefill path, the only reader of host sequence lengths, reads just those,
    so a step with a prefill in it needs no device-to-host copy (a sync in the middle of
    the forward). Without it the first prefill call copies the device lengths."""
    n = num_reqs
    return PrismMetadata(block_table=md.block_table[:n], seq_lens=md.seq_lens[:n],
                         query_start_loc=md.query_start_loc[:n + 1],
                         max_query_len=md.max_query_len, max_seq_len=md.max_seq_len,
                         query_start_loc_cpu=query_start_loc_cpu[:n + 1],
                         seq_lens_cpu=None if seq_lens_cpu is None else seq_lens_cpu[:n])


def vllm_flash_section_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                 causal: bool, scale: float
                                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Section attention on vLLM's own flash-attention build (one sequence, native GQA,
    bottom-right causal alignment); returns the output and the log-sum-exp [heads, rows]."""
    from vllm.vllm_flash_attn import flash_attn_varlen_func

    m, n = q.shape[0], k.shape[0]
    # Built on the device: torch.tensor([...], device=cuda) copies from pageable memory and
    # waits for the stream to drain, a host sync per layer of every prefill step.
    cu = torch.arange(2, dtype=torch.int32, device=q.device)
    cu_q, cu_k = cu * m, cu * n
    out, lse = flash_attn_varlen_func(q, k, v, max_seqlen_q=m, cu_seqlens_q=cu_q,
                                      max_seqlen_k=n, cu_seqlens_k=cu_k, softmax_scale=scale,
                                      causal=causal, return_softmax_lse=True)
    return out, lse


def _section_attention_fn() -> Any:
    """vLLM's flash attention for prefill sections where it is built, else torch SDPA."""
    try:
        import vllm.vllm_flash_attn  # noqa: F401
    except ImportError:
        return None
    return vllm_flash_section_attention


class PrismAttentionImpl(TritonAttentionImpl):
    """Decoder self-attention through vllm_prism.attention.ops."""

    def prism_supported(self) -> tuple[bool, str]:
        if self.attn_type != AttentionType.DECODER:
            return False, f"attention type {self.attn_type}"
        if self.kv_cache_dtype not in SUPPORTED_KV_DTYPES:
            return False, f"KV cache dtype {self.kv_cache_dtype}"
        if self.alibi_slopes is not None or self.sinks is not None:
            return False, "ALiBi or attention sinks"
        if self.sliding_window not in (None, (-1, -1)):
            return False, "sliding window"
        if self.logits_soft_cap:
            return False, "logits soft-cap"
        return True, ""

    def forward(self, layer: Any, query: torch.Tensor, key: torch.Tensor,
                value: torch.Tensor, kv_cache: torch.Tensor, attn_metadata: Any,
                output: torch.Tensor, output_scale: torch.Tensor | None = None,
                output_block_scale: torch.Tensor | None = None) -> torch.Tensor:
        ok, why = self.prism_supported()
        if not ok or output_scale is not None or output_block_scale is not None:
            if not getattr(self, "_prism_fallback_logged", False):
                logger.info("PRISM attention: using the Triton backend for this layer (%s)",
                            why or "fused output quantization")
                self._prism_fallback_logged = True
            return super().forward(layer, query, key, value, kv_cache, attn_metadata, output,
                                   output_scale, output_block_scale)
        if attn_metadata is None:  # profiling run
            return output.fill_(0)
        causal = getattr(attn_metadata, "causal", True) is True
        if not causal and attn_metadata.prism_plan.prefill:
            # A non-causal chunk longer than the split path takes: vLLM's Triton kernel.
            return super().forward(layer, query, key, value, kv_cache, attn_metadata, output,
                                   output_scale, output_block_scale)
        # A non-causal step (a DFlash drafter's draft blocks against the whole context) runs
        # the split path with no causal tail: vLLM's Triton kernel would walk a long context
        # in one program per KV head (2.1 ms at 32K on the H200).
        if self._is_per_token_head_quant:
            self._ensure_scale_caches(kv_cache)
        self._warm_prefill(query, kv_cache)
        n = attn_metadata.num_actual_tokens
        if not hasattr(self, "_prism_attn_fn"):
            self._prism_attn_fn = _section_attention_fn() if query.is_cuda else None
        mixed_attention(query[:n], kv_cache, attn_metadata.prism, scale=self.scale,
                        out=output[:n], attn_fn=self._prism_attn_fn,
                        plan=attn_metadata.prism_plan, causal=causal,
                        fresh=self._fresh_kv(key, value, n, attn_metadata))
        return output

    def _warm_prefill(self, query: torch.Tensor, kv_cache: torch.Tensor) -> None:
        """Compile the prefill path's gather kernel at this layer's first eager forward with a
        cache (vLLM's warm-up runs), not at a prompt's first chunk past context 0: the
        warm-up's prefills start at context 0, which reads no cache (docs/attention.md)."""
        if getattr(self, "_prism_warm", False) or not query.is_cuda:
            return
        if torch.cuda.is_current_stream_capturing():
            return  # a capture records it; the eager warm-up before it runs it
        warm_gather_kv(kv_cache, query.dtype, query.shape[-1])
        self._prism_warm = True

    def _fresh_kv(self, key: torch.Tensor | None, value: torch.Tensor | None, n: int,
                  attn_metadata: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The step's own K and V for prefill chunks at context 0, where this layer wrote
        them (not a layer that reads another's cache) and VLLM_PRISM_PREFILL_FRESH_KV is on."""
        if (key is None or value is None or not attn_metadata.prism_plan.prefill
                or getattr(self, "kv_sharing_target_layer_name", None) is not None
                or not envs.VLLM_PRISM_PREFILL_FRESH_KV):
            return None
        return key[:n], value[:n]


class PrismAttentionBackend(TritonAttentionBackend):
    """Registered as attention backend "PRISM" (``--attention-backend PRISM``)."""

    supported_kv_cache_dtypes: ClassVar[list] = list(SUPPORTED_KV_DTYPES)

    @staticmethod
    def get_name() -> str:
        return BACKEND_NAME

    @staticmethod
    def get_impl_cls() -> type[PrismAttentionImpl]:
        return PrismAttentionImpl

    @staticmethod
    def get_builder_cls() -> type[PrismAttentionMetadataBuilder]:
        return PrismAttentionMetadataBuilder


# The enum member vLLM's processes agree on: a dynamically added member ("PRISM") exists only
# in processes that ran our plugin before unpickling the engine config, and vLLM's engine-core
# process unpickles it first; CUSTOM is a member everywhere, its class set by the plugin.
PROCESS_SAFE_MEMBER = "CUSTOM"


def register_attention_backend() -> None:
    """Register our backend as vLLM's CUSTOM attention backend and under the name "PRISM"
    (``--attention-backend PRISM``), once per process."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    path = f"{__name__}.PrismAttentionBackend"
    register_backend(AttentionBackendEnum[PROCESS_SAFE_MEMBER], path)
    if BACKEND_NAME not in AttentionBackendEnum.__members__:
        register_backend(BACKEND_NAME, path)


def is_prism_choice(backend: object) -> bool:
    """Whether an --attention-backend value names our backend."""
    name = getattr(backend, "name", backend)
    return isinstance(name, str) and name.upper() == BACKEND_NAME
