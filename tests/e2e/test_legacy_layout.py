"""Legacy Q2_0 files (no Prism Hadamard contract) are laid out as llama.cpp's converter lays
them out: ``ssm_out``'s input columns in tiled value-head order, like every other value-head
axis. The loader must hand vLLM the Hugging Face order, checked against the oracle's
un-tiling written from the converter's rule (tests/e2e/oracle.py)."""

from __future__ import annotations

import numpy as np
import pytest

from vllm_prism.gguf.codecs import dequantize
from vllm_prism.gguf.constants import GGMLType

from . import oracle

pytest.importorskip("vllm")

OUT_PROJ = "model.layers.0.linear_attn.out_proj.weight"


@pytest.fixture(scope="module")
def legacy(tiny_gguf):
    return tiny_gguf("q2_0", seed=7)


def _loaded(path) -> dict[str, np.ndarray]:
    from vllm_prism.model_executor.model_loader.gguf_loader import iterate_gguf_weights

    return {n: t.numpy() for n, t in iterate_gguf_weights(str(path)) if "out_proj" in n}


def test_loader_untiles_ssm_out_like_the_converter(legacy) -> None:
    raw = _loaded(legacy)[OUT_PROJ]
    got = dequantize(raw, GGMLType.Q2_0, group=128)
    _, state = oracle.unfold_gguf(legacy)
    want = state[OUT_PROJ].numpy()
    np.testing.assert_array_equal(got, want)


def test_reading_it_grouped_is_caught(legacy) -> None:
    """The old mistake (legacy ssm_out read in grouped order) gives other weights: a test
    comparing with the converter's rule fails on it."""
    _, grouped = oracle.unfold_gguf(legacy, legacy_gdn_v_grouped=True)
    _, tiled = oracle.unfold_gguf(legacy)
    assert not np.array_equal(grouped[OUT_PROJ].numpy(), tiled[OUT_PROJ].numpy())


def test_heads_not_spanning_blocks_are_refused() -> None:
    """Value heads narrower than a block cannot be un-tiled on packed rows: a serving
    problem (reported before the engine starts), naming the tensor."""
    import types

    from vllm_prism.gguf.constants import GGML_BLOCK_LAYOUTS
    from vllm_prism.gguf.inspect import _legacy_layout_problems

    layout = GGML_BLOCK_LAYOUTS[GGMLType.Q2_0]
    info = types.SimpleNamespace(ggml_type=GGMLType.Q2_0, layout=layout)
    reader = types.SimpleNamespace(tensors={"blk.0.ssm_out.weight": info})
    narrow = types.SimpleNamespace(head_v_dim=64)
    wide = types.SimpleNamespace(head_v_dim=128)
    problems = _legacy_layout_problems(reader, narrow)
    assert len(problems) == 1 and "blk.0.ssm_out.weight" in problems[0]
    assert _legacy_layout_problems(reader, wide) == []
