"""The INT8 cache vLLM 0.32 lays out for Bonsai 2 27B can take the TMA verification form.

VLLM_PRISM_ATTN_VERIFY_FORM=auto serves the warpgroup-MMA form fed by TMA only where
``cuda_decode.tma_layout_problem`` accepts the cache (a slot's KV heads side by side, 16-byte
aligned slots, blocks and base), and falls back to the slower mma form elsewhere (an info
line saying why, no warning). Here vLLM's own functions plan the 27B's hybrid cache on the
CPU: the layer specs (48 Gated DeltaNet layers, 16 full-attention layers with the
per-token-head INT8 content the PRISM backend's customize_spec gives), the layout vLLM
resolves for the backends' declared preferences, the KV-cache groups and tensors, and each
attention layer's view over the shared pool, on meta tensors; also with the DFlash2 drafter's
layers, whose larger page pads the target's. Every view must pass the check; a vLLM upgrade
that changes the layout or the page padding fails here instead of silently costing the TMA
form (the GPU DFlash test checks the same inside a running engine, on the tiny model's cache).
"""

from __future__ import annotations

import dataclasses
import types

import pytest
import torch

pytest.importorskip("vllm")

import vllm.v1.core.kv_cache_utils as kcu  # noqa: E402
from vllm.v1.attention.backends.gdn_attn import GDNAttentionBackend  # noqa: E402
from vllm.v1.attention.backends.utils import (get_supported_kv_cache_layouts,  # noqa: E402
                                              resolve_kv_cache_layout)
from vllm.v1.kv_cache_interface import (AttentionSpec, FullAttentionSpec,  # noqa: E402
                                        KVCacheSpec, KVQuantMode, MambaSpec,
                                        SlidingWindowSpec, create_kv_cache_views)
from vllm.v1.kv_cache_layout import KVCacheLayout  # noqa: E402
from patches.test_kv_cache_group_size import vllm_config  # noqa: E402 (tests/ on sys.path)

from vllm_prism.attention.backends.prism_attn import PrismAttentionBackend  # noqa: E402
from vllm_prism.attention.ops.cuda_decode import tma_layout_problem  # noqa: E402

HEAD, KV_HEADS = 256, 4  # Bonsai 2 27B's full-attention layers
GDN_SHAPES = ((3, 10240), (48, 128, 128))  # its Gated DeltaNet conv and recurrent state


def _config(layout: str | None) -> types.SimpleNamespace:
    """The planning functions' config (the KV-cache group test's), ``layout`` unresolved
    where None."""
    cfg = vllm_config(33792)
    cfg.cache_config.kv_cache_layout = layout
    cfg.kv_transfer_config = None  # no connector with a layout preference
    return cfg


def _int8(spec: AttentionSpec) -> AttentionSpec:
    """The per-token-head INT8 content the PRISM backend gives an attention spec."""
    return PrismAttentionBackend.customize_spec(spec)


def _specs(drafter: bool = False) -> dict[str, KVCacheSpec]:
    """The 27B's layer specs, the attention block size raised until its page holds a Gated
    DeltaNet state and the state's page padded to it (what vLLM does for hybrid models);
    ``drafter``: with the DFlash2 drafter's 5 sliding-window layers (8 KV heads of 128, INT8
    on the PRISM backend) at the same block size, whose larger page vLLM's planning pads
    every other page to."""
    attn = _int8(FullAttentionSpec(
        block_size=16, num_kv_heads=KV_HEADS, head_size=HEAD, head_size_v=HEAD,
        dtype=torch.int8, kv_quant_mode=KVQuantMode.INT8_PER_TOKEN_HEAD))
    state = MambaSpec(block_size=16, shapes=GDN_SHAPES, dtypes=(torch.bfloat16, torch.float32))
    per_token = attn.page_size_bytes // attn.block_size
    block = -(-state.page_size_bytes // (16 * per_token)) * 16  # a multiple of 16 (1552)
    attn = dataclasses.replace(attn, block_size=block)
    state = MambaSpec(block_size=block, shapes=GDN_SHAPES,
                      dtypes=(torch.bfloat16, torch.float32),
                      page_size_padded=attn.page_size_bytes)
    specs: dict[str, KVCacheSpec] = {f"model.layers.{i}": attn if (i + 1) % 4 == 0 else state
                                     for i in range(64)}
    if drafter:
        draft = _int8(SlidingWindowSpec(
            block_size=block, num_kv_heads=8, head_size=128, head_size_v=128,
            dtype=torch.int8, kv_quant_mode=KVQuantMode.INT8_PER_TOKEN_HEAD,
            sliding_window=2048))
        specs.update({f"draft.layers.{i}": draft for i in range(5)})
    return specs


def _attention_views(layout: KVCacheLayout, drafter: bool = False) -> list[torch.Tensor]:
    """Every target full-attention layer's cache view as vLLM's planning lays it out."""
    specs = _specs(drafter)
    cfg = _config(layout.name)
    groups = kcu.get_kv_cache_groups(cfg, dict(specs))
    config = kcu.get_kv_cache_config_from_groups(cfg, groups, 2 << 30)
    planned = {n: g.kv_cache_spec for g in config.kv_cache_groups for n in g.layer_names}
    views = []
    for tensor in config.kv_cache_tensors:
        raw = torch.empty(tensor.size, dtype=torch.int8, device="meta")
        targets = [n for n in tensor.layers if n.startswith("model.")
                   and isinstance(planned[n], FullAttentionSpec)]
        if targets:
            spec = planned[targets[0]]
            layer_views = create_kv_cache_views(raw, spec, config.num_blocks, layout, tensor)
            views += [v for n, v in zip(tensor.layers, layer_views) if n in targets]
    return views


@pytest.mark.parametrize("drafter", [False, True], ids=["target", "with_drafter"])
def test_vllm_resolves_the_nhd_layout_for_these_backends(drafter: bool) -> None:
    supported = get_supported_kv_cache_layouts([PrismAttentionBackend, GDNAttentionBackend])
    layout = resolve_kv_cache_layout(_config(None), [[m.name for m in supported]],
                                     _specs(drafter).values())
    assert layout == KVCacheLayout.LBNHC


@pytest.mark.parametrize("drafter", [False, True], ids=["target", "with_drafter"])
def test_every_attention_view_takes_the_tma_form(drafter: bool) -> None:
    views = _attention_views(KVCacheLayout.LBNHC, drafter)
    assert len(views) == 16
    # with the drafter the target's pages are padded to the drafter's larger page
    assert all((v.stride(0) > v.shape[2] * v.stride(2)) == drafter for v in views)
    for view in views:
        assert view.shape[1:] == (KV_HEADS, view.shape[2], 2 * HEAD + 8)
        assert tma_layout_problem(view, HEAD) is None, (view.shape, view.stride())


def test_a_head_major_layout_would_lose_it() -> None:
    """The check the previous test relies on can fail: in vLLM's HND layout a slot's row
    stride is one 520-byte head row, which no 16-byte TMA box stride can take."""
    views = _attention_views(KVCacheLayout.LBHNC)
    assert views and all(tma_layout_problem(v, HEAD) is not None for v in views)
