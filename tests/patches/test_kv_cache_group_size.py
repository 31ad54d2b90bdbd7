"""vllm_prism/patches/kv_cache_group_size.py on vLLM's own planning functions, with the
Bonsai 2 layer specs (48 Gated DeltaNet, 16 full-attention, 5 DFlash2 sliding-window layers,
one page size as vLLM unifies it) and with the hybrid patterns vLLM already handles."""

from __future__ import annotations

import types

import pytest
import torch

pytest.importorskip("vllm")

import vllm.v1.core.kv_cache_utils as kcu  # noqa: E402
from vllm.config import CacheConfig  # noqa: E402
from vllm.v1.kv_cache_interface import (ChunkedLocalAttentionSpec,  # noqa: E402
                                        FullAttentionSpec, MambaSpec, SlidingWindowSpec)

from vllm_prism.patches import kv_cache_group_size as patch  # noqa: E402

BLOCK = 1024  # tokens per block: a 4 MiB page holds one GDN layer's state
FULL = FullAttentionSpec(block_size=BLOCK, num_kv_heads=4, head_size=256, dtype=torch.bfloat16)
PAGE = FULL.page_size_bytes
GDN = MambaSpec(block_size=BLOCK, shapes=((3, 10240), (48, 128, 128)),
                dtypes=(torch.bfloat16, torch.float32), page_size_padded=PAGE)
DRAFT = SlidingWindowSpec(block_size=BLOCK, num_kv_heads=8, head_size=128,
                          dtype=torch.bfloat16, sliding_window=2048)
LOCAL = ChunkedLocalAttentionSpec(block_size=BLOCK, num_kv_heads=4, head_size=256,
                                  dtype=torch.bfloat16, attention_chunk_size=8192)
SW = SlidingWindowSpec(block_size=BLOCK, num_kv_heads=4, head_size=256, dtype=torch.bfloat16,
                       sliding_window=4096)
BUDGET = 20 << 30


def vllm_config(max_model_len: int, in_flight: int = 8192) -> types.SimpleNamespace:
    cache = CacheConfig()
    cache.kv_cache_layout = "LBNHC"  # what vLLM resolves for these backends
    return types.SimpleNamespace(
        model_config=types.SimpleNamespace(max_model_len=max_model_len),
        cache_config=cache, speculative_config=None, max_in_flight_tokens=in_flight,
        attention_config=types.SimpleNamespace(hisparse_config=None),
        scheduler_config=types.SimpleNamespace(disable_hybrid_kv_cache_manager=False,
                                               max_num_batched_tokens=8192),
        parallel_config=types.SimpleNamespace(decode_context_parallel_size=1,
                                              prefill_context_parallel_size=1,
                                              tensor_parallel_size=1))


def bonsai_specs(drafter: bool = True) -> dict:
    specs = {f"model.layers.{i}": FULL if (i + 1) % 4 == 0 else GDN for i in range(64)}
    if drafter:
        specs.update({f"draft.layers.{i}": DRAFT for i in range(5)})
    return specs


def plan(specs: dict, max_model_len: int, patched: bool,
         in_flight: int = 8192) -> tuple[list, int]:
    """(groups, token capacity at BUDGET) from vLLM's planning with or without the patch."""
    cfg = vllm_config(max_model_len, in_flight)
    inner = kcu._get_kv_cache_groups_uniform_page_size
    fn = inner if patched else getattr(inner, "__wrapped__", inner)
    token = patch._CONFIG.set(cfg)
    try:
        groups = fn(dict(specs))
    finally:
        patch._CONFIG.reset(token)
    config = kcu.get_kv_cache_config_from_groups(cfg, groups, BUDGET)
    concurrency = kcu.get_max_concurrency_for_kv_cache_config(cfg, config)
    return groups, int(concurrency * max_model_len)


@pytest.fixture(scope="module", autouse=True)
def applied():
    patch.apply()


# The patch's plan for Bonsai 2 with the drafter where padding the drafter's group is cheapest
SIXTEENS = [("MambaSpec", 16)] * 3 + [("FullAttentionSpec", 16), ("SlidingWindowSpec", 5)]


def _sizes(groups: list) -> list[tuple[str, int]]:
    return [(type(g.kv_cache_spec).__name__, len(g.layer_names)) for g in groups]


@pytest.mark.parametrize("max_model_len", [65536, 262144])
def test_bonsai_with_drafter_pads_only_the_drafter(max_model_len: int) -> None:
    before, cap_before = plan(bonsai_specs(), max_model_len, patched=False)
    after, cap_after = plan(bonsai_specs(), max_model_len, patched=True)
    assert max(len(g.layer_names) for g in before) == 5  # vLLM 0.32: 4 full groups of 5
    full_after = [g for g in after if isinstance(g.kv_cache_spec, FullAttentionSpec)
                  and not isinstance(g.kv_cache_spec, SlidingWindowSpec)]
    assert [len(g.layer_names) for g in full_after] == [16]
    assert _sizes(after) == SIXTEENS
    gain = cap_after / cap_before - 1
    print(f"max_model_len {max_model_len}: {cap_before:,} -> {cap_after:,} tokens "
          f"({gain:+.1%})")
    assert gain > (0.10 if max_model_len == 65536 else 0.20)
    # every layer still in exactly one group
    names = sorted(n for g in after for n in g.layer_names)
    assert names == sorted(bonsai_specs())


def test_short_context_keeps_vllms_choice() -> None:
    """Below the drafter's window plus the in-flight tokens, padding the drafter group to
    16 costs more than padding the full-attention groups to 5: vLLM's plan stands."""
    before, _ = plan(bonsai_specs(), 4096, patched=False)
    after, _ = plan(bonsai_specs(), 4096, patched=True)
    assert _sizes(after) == _sizes(before)


@pytest.mark.parametrize("max_model_len,in_flight,sizes", [
    (33024, 8192, SIXTEENS),
    (33024, 16384, [("MambaSpec", 5)] * 8 + [("MambaSpec", 4)] * 2
     + [("FullAttentionSpec", 4)] * 4 + [("SlidingWindowSpec", 5)]),
    (65792, 16384, SIXTEENS),
])
def test_at_32k_the_tokens_in_flight_decide(max_model_len: int, in_flight: int,
                                            sizes: list) -> None:
    """The bench's 32K engine (max_model_len 33024): the drafter's window holds its last
    2,047 tokens plus every token in flight, so with two batches in flight (async scheduling:
    vLLM's max_in_flight_tokens = 2 x 8192) padding its group to 16 costs more than padding
    the full-attention groups to 5, and vLLM's 15 groups of at most 5 layers stand: the
    group sizes the H100 run recorded (e2e_h100-80gb-hbm3.json, kv_cache_groups); with one
    batch in flight the drafter's padding is the cheaper one and the patch gives 5 groups,
    and at 64K (the next measurement's context) it is the cheaper one with two as well."""
    after, _ = plan(bonsai_specs(), max_model_len, patched=True, in_flight=in_flight)
    assert _sizes(after) == sizes


@pytest.mark.parametrize("name,specs", [
    ("qwen3.5 without drafter", bonsai_specs(drafter=False)),
    ("gemma3 5:1", {f"l{i}": FULL if i % 6 == 5 else SW for i in range(62)}),
    ("llama4 3:1 chunked", {f"l{i}": FULL if i % 4 == 3 else LOCAL for i in range(48)}),
    ("gpt-oss + eagle", {**{f"l{i}": SW if i % 2 else FULL for i in range(24)},
                         "eagle": FULL}),
])
def test_patterns_vllm_handles_come_out_unchanged(name: str, specs: dict) -> None:
    for max_model_len in (8192, 131072):
        before, _ = plan(specs, max_model_len, patched=False)
        after, _ = plan(specs, max_model_len, patched=True)
        assert [g.layer_names for g in after] == [g.layer_names for g in before], name


def test_vllms_entry_point_uses_the_patch() -> None:
    """get_kv_cache_groups (what the engine core and the workers call) hands its config
    through: the Bonsai 2 + drafter specs come out in groups of 16."""
    groups = kcu.get_kv_cache_groups(vllm_config(262144), bonsai_specs())
    assert max(len(g.layer_names) for g in groups) == 16


def test_patch_declares_its_versions_and_pr_text() -> None:
    from pathlib import Path

    p = patch.PATCH
    assert p.applies_to("0.32.0") and not p.applies_to("0.31.0")
    assert (Path(__file__).resolve().parents[2] / p.upstream_doc).is_file()
    assert p.target.endswith("_get_kv_cache_groups_uniform_page_size")
