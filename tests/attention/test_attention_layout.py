"""CPU tests of the cache layout, the reference, routing and bookkeeping (no Triton needed).

Where vLLM is installed, the layout is checked against vLLM 0.32's own views of the same
tensor: ``TritonAttentionImpl._pth_key_value_caches`` / ``_ensure_scale_caches`` (INT8 data and
the fp32 scale views) and ``TritonAttentionBackend.customize_spec`` (content bytes).
"""

from __future__ import annotations

import math

import pytest
import torch

from vllm_prism.attention.ops import (AttentionMetadata, kv_format, make_kv_cache,
                                      quantize_per_token_head, reference_attention,
                                      route_requests, write_kv)
from vllm_prism.attention.ops.prefill import SCRATCH_BYTES, section_tokens_for

HS, HKV = 256, 4


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("dtype", [torch.int8, torch.bfloat16])
def test_layout_strides(layout: str, dtype: torch.dtype) -> None:
    c = make_kv_cache(5, HKV, 16, HS, dtype, layout)
    content = 2 * (HS + 4) if dtype == torch.int8 else 2 * HS
    assert c.shape == (5, HKV, 16, content)
    f = kv_format(c)
    if layout == "NHD":
        assert (f.stride_head, f.stride_slot) == (content, HKV * content)
    else:
        assert (f.stride_slot, f.stride_head) == (content, 16 * content)
    assert f.stride_block == 16 * HKV * content
    if dtype == torch.int8:
        assert (f.k_off, f.k_scale_off, f.v_off, f.v_scale_off) == (0, 256, 260, 516)
        assert f.row_align == 8  # 520-byte rows: K rows are 8-byte aligned
        assert f.bytes_per_token == HKV * 520
    else:
        assert (f.k_off, f.v_off) == (0, 256)
        assert f.row_align == 8  # 16 bytes
        assert f.bytes_per_token == HKV * 1024
    assert f.bytes_per_token * 1.0 / (HKV * 1024) == pytest.approx(
        0.508 if dtype == torch.int8 else 1.0, abs=1e-3)


def test_quantizer_matches_vllm_rule() -> None:
    x = torch.tensor([[1.27, -0.635, 0.00499, 0.0, 0.3175, -1.27]])
    q, s = quantize_per_token_head(x)
    assert s.item() == pytest.approx(0.01)
    # x / s = 127, -63.5, 0.499, 0, 31.75, -127: half away from zero
    assert q.tolist() == [[127, -64, 0, 0, 32, -127]]
    q0, s0 = quantize_per_token_head(torch.zeros(1, 8))
    assert s0.item() == pytest.approx(1e-6) and q0.abs().sum() == 0


def test_write_and_reference_roundtrip() -> None:
    torch.manual_seed(0)
    c = make_kv_cache(4, HKV, 16, HS, torch.int8, "NHD", fill="zeros")
    k, v = torch.randn(20, HKV, HS), torch.randn(20, HKV, HS)
    bt = torch.tensor([[3, 1]], dtype=torch.int32)
    pos = torch.arange(20)
    write_kv(c, k, v, bt[0][pos // 16].long() * 16 + pos % 16)
    from vllm_prism.attention.ops.reference import gather_dequantized
    kk, vv = gather_dequantized(c, bt[0], 20, HS)
    # int8 per token-head: error at most half a step (absmax / 254) per element
    assert ((kk - k).abs() <= k.abs().amax(-1, keepdim=True) / 254 + 1e-6).all()
    assert ((vv - v).abs() <= v.abs().amax(-1, keepdim=True) / 254 + 1e-6).all()
    # single cached token: attention output is V itself
    q = torch.randn(1, HKV * 6, HS)
    out = reference_attention(q, c, bt, [1], [0, 1])
    assert torch.allclose(out, vv[:1].repeat_interleave(6, 1), atol=1e-6)


def test_layout_matches_vllm_views() -> None:
    pytest.importorskip("vllm")
    from vllm.v1.attention.backends.triton_attn import TritonAttentionBackend, TritonAttentionImpl
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVQuantMode

    spec = FullAttentionSpec(block_size=16, num_kv_heads=HKV, head_size=HS, dtype=torch.int8,
                             kv_quant_mode=KVQuantMode.INT8_PER_TOKEN_HEAD)
    assert TritonAttentionBackend.customize_spec(spec).state_content_size_bytes == 2 * (HS + 4)
    for layout in ("NHD", "HND"):
        torch.manual_seed(1)
        c = make_kv_cache(3, HKV, 16, HS, torch.int8, layout, fill="zeros")
        impl = object.__new__(TritonAttentionImpl)
        impl._k_scale_cache = impl._v_scale_cache = None
        impl._kv_quant_mode = KVQuantMode.INT8_PER_TOKEN_HEAD
        key_cache, value_cache = impl._pth_key_value_caches(c)  # fills scales with 1.0
        k, v = torch.randn(40, HKV, HS), torch.randn(40, HKV, HS)
        slots = torch.randperm(48)[:40]
        write_kv(c, k, v, slots)
        kq, ks = quantize_per_token_head(k)
        vq, vs = quantize_per_token_head(v)
        blk, off = slots // 16, slots % 16
        # vLLM's views: key_cache [B, N, H, hs+4] (data in [:hs]), scales [B, N, H] fp32
        assert torch.equal(key_cache[blk, off][..., :HS], kq)
        assert torch.equal(value_cache[blk, off][..., :HS], vq)
        assert torch.equal(impl._k_scale_cache[blk, off], ks)
        assert torch.equal(impl._v_scale_cache[blk, off], vs)


def test_routing() -> None:
    dec, ver, pre = route_requests([1, 5, 300, 1, 16, 17, 2])
    assert (dec, ver, pre) == ([0, 3], [1, 4, 6], [2, 5])


def test_scratch_bound() -> None:
    assert section_tokens_for(4, 256) == 32768
    assert 2 * section_tokens_for(4, 256) * 4 * 256 * 2 <= SCRATCH_BYTES
    assert section_tokens_for(8, 256) == 16384  # never more than ~128 MiB
    assert section_tokens_for(1, 64) == 32768


def test_metadata_build() -> None:
    md = AttentionMetadata.build(torch.zeros(2, 4, dtype=torch.int32), [10, 3], [1, 3])
    assert md.query_start_loc.tolist() == [0, 1, 4] and md.max_query_len == 3
    assert md.query_lens() == [1, 3] and md.num_tokens == 4
    with pytest.raises(ValueError):
        AttentionMetadata.build(torch.zeros(1, 4, dtype=torch.int32), [2], [3])


def test_bad_cache_is_refused() -> None:
    with pytest.raises(ValueError, match="int8_per_token_head"):
        make_kv_cache(2, 4, 16, 256, torch.float32)
    with pytest.raises(ValueError, match="logical 4-D"):
        kv_format(torch.zeros(2, 16, 4, dtype=torch.int8))
    assert math.isfinite(kv_format(make_kv_cache(2, 4, 16, 256, torch.int8)).row_align)
