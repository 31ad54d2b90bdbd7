"""Patch: the Triton backend's INT8 scale views overwrite Gated DeltaNet state in hybrid models.

What breaks: with ``--kv-cache-dtype int8_per_token_head`` (or fp8/int4 per-token-head) on a
hybrid model such as Qwen3.5 / Bonsai (Gated DeltaNet + full attention), the first
generated token is right and every later one is garbage.

Why: ``TritonAttentionImpl._ensure_scale_caches`` builds float32 views of the inline scale
slots over the attention layer's whole KV-cache tensor at its first call and fills them
with 1.0. In a hybrid model that tensor is a view of a buffer shared with the other KV-cache
groups: blocks the attention layer does not own hold the recurrent state of Gated DeltaNet
layers, which already wrote it earlier in the same forward pass. The fill writes 1.0 into
every (block, slot, head) scale position of the whole buffer, i.e. into that state.

The fix: no fill. The views are vLLM's own: its view builder runs on a meta-device twin of
the cache to give their geometry, and the views are then made over the real storage. The
fill is not needed: the per-token-head cache writer stores a scale
with every K/V row it writes, and the attention kernel loads scales only under the mask of
positions inside the sequence (``other=1.0`` elsewhere), so every scale that is read has
been written. The views are cached per storage (data pointer, offset, shape and strides)
instead of once per layer, so a re-allocated cache gets fresh views.

Applies to: vLLM 0.32.x (``vllm/v1/attention/backends/triton_attn.py``). Test:
tests/patches/test_int8_scale_view_fill.py (fails without the patch). PR text:
docs/upstream/int8-scale-view-fill.md.
"""

from __future__ import annotations

import types
from typing import Any

import torch

from vllm_prism.patches import VllmPatch


def _storage_key(kv_cache: torch.Tensor) -> tuple:
    return (kv_cache.untyped_storage().data_ptr(), kv_cache.storage_offset(),
            tuple(kv_cache.shape), tuple(kv_cache.stride()), kv_cache.dtype)


def _scale_view_geometry(kv_cache: torch.Tensor) -> tuple[tuple, tuple, int, int]:
    """(size, stride, K offset, V offset) of the float32 scale views, in float32 units, as
    vLLM's own ``_ensure_scale_caches`` computes them: it runs on a meta-device twin of the
    cache (same shape, strides and storage offset), where its ``fill_`` writes nothing, so
    the geometry cannot drift from vLLM's."""
    elements = kv_cache.untyped_storage().nbytes() // kv_cache.element_size()
    twin = torch.empty(elements, dtype=kv_cache.dtype, device="meta").as_strided(
        kv_cache.shape, kv_cache.stride(), kv_cache.storage_offset())
    holder = types.SimpleNamespace(_k_scale_cache=None, _v_scale_cache=None)
    stock_method()(holder, twin)
    k, v = holder._k_scale_cache, holder._v_scale_cache
    return tuple(k.shape), tuple(k.stride()), k.storage_offset(), v.storage_offset()


def build_scale_views(kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Float32 views (num_blocks, block_size, num_kv_heads) of the K and V scale slots of a
    per-token-head cache (num_blocks, num_kv_heads, block_size, 2 * (hs + pad)), where
    vLLM puts them. Writes nothing."""
    size, stride, k_off, v_off = _scale_view_geometry(kv_cache)
    base = torch.tensor([], dtype=torch.float32, device=kv_cache.device).set_(
        kv_cache.untyped_storage())
    return (torch.as_strided(base, size, stride, k_off),
            torch.as_strided(base, size, stride, v_off))


def ensure_scale_caches(self: Any, kv_cache: torch.Tensor) -> None:
    """Replacement for TritonAttentionImpl._ensure_scale_caches: no fill, cached per
    storage."""
    key = _storage_key(kv_cache)
    if self._k_scale_cache is not None and getattr(self, "_prism_scale_key", None) == key:
        return
    self._k_scale_cache, self._v_scale_cache = build_scale_views(kv_cache)
    self._prism_scale_key = key


_stock: Any = None


def stock_method() -> Any:
    """vLLM's own _ensure_scale_caches (for the test that shows the bug)."""
    from vllm.v1.attention.backends.triton_attn import TritonAttentionImpl

    return _stock or TritonAttentionImpl._ensure_scale_caches


def apply() -> bool:
    global _stock
    from vllm.v1.attention.backends.triton_attn import TritonAttentionImpl

    if TritonAttentionImpl._ensure_scale_caches is ensure_scale_caches:
        return False
    _stock = TritonAttentionImpl._ensure_scale_caches
    TritonAttentionImpl._ensure_scale_caches = ensure_scale_caches
    return True


PATCH = VllmPatch(
    name="int8_scale_view_fill",
    target="vllm.v1.attention.backends.triton_attn.TritonAttentionImpl._ensure_scale_caches",
    vllm_versions=("0.32.*",),
    apply=apply,
    upstream_doc="docs/upstream/int8-scale-view-fill.md",
    upstream="not yet filed (PR text in docs/upstream/int8-scale-view-fill.md)",
    remove_when="TritonAttentionImpl._ensure_scale_caches no longer fills the scale views "
                "of a shared hybrid KV-cache buffer",
    test="tests/patches/test_int8_scale_view_fill.py",
)
