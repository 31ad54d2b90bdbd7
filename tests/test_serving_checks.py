"""`inspect` runs every check serving runs before the engine starts, and serving refuses
with the same one-line-per-problem message naming the file: metadata the text config,
the tokenizer or the chat template cannot take, and metadata of the wrong type."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from vllm_prism.gguf.constants import GGUFValueType as T
from vllm_prism.gguf.inspect import inspect_gguf
from vllm_prism.gguf.reader import GGUFReader
from vllm_prism.gguf.writer import GGUFWriter

DROP = object()
# case -> ({key: value | (value, type, element type) | DROP}, text the problem must name)
CASES = {
    "context_length_0": ({"qwen35.context_length": (0, T.UINT32, None)},
                         "qwen35.context_length"),
    "no_rope_sections": ({"qwen35.rope.dimension_sections": DROP},
                         "qwen35.rope.dimension_sections"),
    "rope_base_nan": ({"qwen35.rope.freq_base": (math.nan, T.FLOAT32, None)},
                      "qwen35.rope.freq_base"),
    "rope_dims_1000": ({"qwen35.rope.dimension_count": (1000, T.UINT32, None)},
                       "qwen35.rope.dimension_count"),
    "negative_eps": ({"qwen35.attention.layer_norm_rms_epsilon": (-1.0, T.FLOAT32, None)},
                     "qwen35.attention.layer_norm_rms_epsilon"),
    "merges_not_pairs": ({"tokenizer.ggml.merges": (["a b c", "x"], T.ARRAY, T.STRING)},
                         "tokenizer.ggml.merges"),
    "integer_tokens": ({"tokenizer.ggml.tokens": (list(range(512)), T.ARRAY, T.INT32)},
                       "tokenizer.ggml.tokens"),
    "string_eos": ({"tokenizer.ggml.eos_token_id": ("abc", T.STRING, None)},
                   "tokenizer.ggml.eos_token_id"),
    "tokens_not_array": ({"tokenizer.ggml.tokens": (512, T.UINT32, None)},
                         "tokenizer.ggml.tokens"),
    "string_token_types": ({"tokenizer.ggml.token_type": (["1"] * 512, T.ARRAY, T.STRING)},
                           "tokenizer.ggml.token_type"),
}


def rewrite(src: Path, dst: Path, changes: dict) -> Path:
    with GGUFReader(src) as r:
        w = GGUFWriter(dst)
        for key, value in r.metadata.items():
            change = changes.get(key)
            if change is DROP:
                continue
            if change is None:
                w.add_metadata(key, value, r.metadata_types[key])
            else:
                w.add_metadata(key, change[0], change[1], change[2])
        for name, info in r.tensors.items():
            w.add_tensor(name, r.raw(name) if info.ggml_type not in (0, 1, 30)
                         else r.tensor(name), info.ggml_type, shape=info.shape)
        w.write()
    return dst


@pytest.fixture(scope="module")
def tiny(tiny_gguf) -> Path:
    return tiny_gguf("pq2_0")


@pytest.mark.parametrize("case", list(CASES))
def test_inspect_and_serving_refuse_alike(case: str, tiny: Path, tmp_path: Path,
                                          monkeypatch) -> None:
    pytest.importorskip("vllm")
    from vllm_prism.engine.arg_utils import prepare_gguf_engine_args

    from test_engine_args import _args

    changes, key = CASES[case]
    bad = rewrite(tiny, tmp_path / f"{case}.gguf", changes)
    problems = inspect_gguf(bad).problems
    assert any(key in p for p in problems), problems
    monkeypatch.setenv("VLLM_PRISM_CACHE_DIR", str(tmp_path))
    with pytest.raises(ValueError) as e:
        prepare_gguf_engine_args(_args(str(bad)))
    msg = str(e.value)
    assert type(e.value) is ValueError and str(bad) in msg
    assert any(p in msg for p in problems if key in p), msg


def test_chat_template_that_does_not_compile_is_a_warning(tiny: Path, tmp_path: Path,
                                                         monkeypatch, caplog) -> None:
    pytest.importorskip("vllm")
    from vllm_prism.engine.arg_utils import prepare_gguf_engine_args

    from test_engine_args import _args

    bad = rewrite(tiny, tmp_path / "template.gguf",
                  {"tokenizer.chat_template": ("{% for m in messages %}{{ m", T.STRING, None)})
    report = inspect_gguf(bad)
    assert report.problems == []
    assert len(report.warnings) == 1 and "chat template does not compile" in report.warnings[0]
    monkeypatch.setenv("VLLM_PRISM_CACHE_DIR", str(tmp_path))
    args = _args(str(bad))
    prepare_gguf_engine_args(args)  # served: completions work, chat requests get a 400
    assert args.tokenizer is not None
