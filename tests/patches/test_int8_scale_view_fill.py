"""The INT8 scale views of the Triton backend must not overwrite state sharing their buffer.

A hybrid model's KV-cache buffer is shared between cache groups: an attention layer's
per-token-head cache view covers blocks that hold Gated DeltaNet state. This test builds
such a buffer on the CPU, fills the "GDN" blocks with recognisable state, and runs the
backend's scale-view setup: stock vLLM 0.32 clobbers the state, the patch does not, and
the patched views still address exactly the scale bytes of the layout.
"""

from __future__ import annotations

import pytest
import torch

triton_attn = pytest.importorskip("vllm.v1.attention.backends.triton_attn")

from vllm_prism.patches import int8_scale_view_fill  # noqa: E402

NUM_BLOCKS, NKV, BLOCK, HS = 6, 2, 16, 64
PAD = 4  # float32 scale bytes after each int8 row
GDN_BLOCKS = [1, 4]  # blocks of the shared buffer that hold another group's state


def _shared_buffer() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    content = 2 * (HS + PAD)
    raw = torch.zeros(NUM_BLOCKS * NKV * BLOCK * content, dtype=torch.int8)
    kv = raw.view(NUM_BLOCKS, NKV, BLOCK, content)
    # The GDN layer's view of the same bytes: float32 state per block.
    state = raw.view(torch.float32).view(NUM_BLOCKS, -1)
    for b in GDN_BLOCKS:
        state[b] = torch.arange(state.shape[1], dtype=torch.float32) + 1000.0 * (b + 1)
    return raw, kv, state


def _impl():
    return object.__new__(triton_attn.TritonAttentionImpl)


def _gdn_snapshot(state: torch.Tensor) -> torch.Tensor:
    return state[GDN_BLOCKS].clone()


def test_stock_vllm_clobbers_shared_state() -> None:
    """Documents the bug (and that this test can fail): the original method writes 1.0
    into the other group's blocks."""
    stock = int8_scale_view_fill.stock_method()
    assert stock is not int8_scale_view_fill.ensure_scale_caches
    _, kv, state = _shared_buffer()
    before = _gdn_snapshot(state)
    stock(_impl(), kv)
    assert not torch.equal(_gdn_snapshot(state), before)
    assert (state[GDN_BLOCKS] == 1.0).any()


def test_patched_views_leave_state_alone_and_address_the_scales() -> None:
    int8_scale_view_fill.apply()  # what vllm_prism.register() does in every process
    raw, kv, state = _shared_buffer()
    before = _gdn_snapshot(state)
    impl = _impl()
    impl._ensure_scale_caches(kv)
    assert torch.equal(_gdn_snapshot(state), before)
    # Write through the views; the bytes must land right after each K and V row.
    k_scale, v_scale = impl._k_scale_cache, impl._v_scale_cache
    assert k_scale.shape == (NUM_BLOCKS, BLOCK, NKV)
    k_scale[2, 5, 1] = 3.5
    v_scale[2, 5, 1] = -2.25
    row = kv[2, 1, 5]
    assert row[HS:HS + PAD].view(torch.float32).item() == 3.5
    assert row[2 * HS + PAD:].view(torch.float32).item() == -2.25
    del raw


def test_views_are_rebuilt_for_a_new_storage() -> None:
    impl = _impl()
    _, kv1, _ = _shared_buffer()
    int8_scale_view_fill.ensure_scale_caches(impl, kv1)
    first = impl._k_scale_cache
    int8_scale_view_fill.ensure_scale_caches(impl, kv1)
    assert impl._k_scale_cache is first
    _, kv2, _ = _shared_buffer()
    int8_scale_view_fill.ensure_scale_caches(impl, kv2)
    assert impl._k_scale_cache.untyped_storage().data_ptr() == kv2.untyped_storage().data_ptr()
