"""`make-tiny --shape`: a model of real dimensions with random ternary weights, for benchmarks.
Checked here on a small shape of the same construction (the 27B shape is 7.2 GB)."""

from __future__ import annotations

import numpy as np
import pytest

from vllm_prism.gguf import tiny
from vllm_prism.gguf.codecs import dequantize
from vllm_prism.gguf.inspect import inspect_gguf
from vllm_prism.gguf.reader import GGUFReader

SMALL = tiny.TinyConfig(n_layers=4, hidden=512, intermediate=1024, n_heads=4, n_kv_heads=2,
                        head_dim=128, n_k_heads=2, n_v_heads=4, linear_head_dim=128,
                        vocab_target=2048, rope_dim=32, rope_sections=(6, 5, 5, 0))


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    path = tmp_path_factory.mktemp("shaped") / "small.gguf"
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(tiny.SHAPES, "small", SMALL)
        mp.setattr(tiny, "_POOL_BLOCKS", 1 << 12)
        tiny.make_shaped_gguf(path, "small", fmt="pq2_0", seed=1)
    return path


def test_shaped_file_is_servable(small) -> None:
    report = inspect_gguf(small)
    assert report.problems == []
    assert report.dims.hidden == 512 and report.dims.vocab_size == 2048
    assert len(report.tokenizer.tokens) == 2048  # padded to the embedding's rows


def test_shaped_weights_are_ternary_with_the_asked_scale(small) -> None:
    """Ternary values, group scales spread 0.75..1.25 about the tensor's, output RMS kept."""
    with GGUFReader(small) as r:
        t = r.tensors["blk.0.ffn_gate.weight"]
        values = dequantize(np.asarray(r.raw("blk.0.ffn_gate.weight")), t.ggml_type)
    groups = values.astype(np.float64).reshape(-1, 128)
    d = np.abs(groups).max(axis=1)  # every group holds a +-1 at this size
    assert np.all(np.isin(np.round(groups / d[:, None]), (-1, 0, 1)))
    scale = 1.0 / np.sqrt(512 * 2.0 / 3.0)
    spread = d / d.mean()
    assert spread.min() > 0.74 and spread.max() < 1.26 and spread.std() > 0.1
    rms = float(np.sqrt((values.astype(np.float64) ** 2).mean()))
    assert abs(rms / (scale * np.sqrt(2 / 3)) - 1) < 0.05


def test_unknown_shape_is_refused(tmp_path) -> None:
    with pytest.raises(ValueError, match="--shape must be one of"):
        tiny.make_shaped_gguf(tmp_path / "x.gguf", "bonsai-9-999b")
