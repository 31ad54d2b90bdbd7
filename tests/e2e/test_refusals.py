"""Unsupported input is refused by LLM() before the engine starts, naming file and problem."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest

from vllm_prism.gguf.constants import GGMLType
from vllm_prism.gguf.reader import GGUFReader
from vllm_prism.gguf.writer import GGUFWriter

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


@pytest.fixture(scope="module")
def tiny(tiny_gguf) -> Path:
    return tiny_gguf("pq2_0")


def _rewrite(src: Path, dst: Path, *, arch: str | None = None, drop: str | None = None,
             drop_keys: str | None = None) -> Path:
    with GGUFReader(src) as r:
        w = GGUFWriter(dst)
        for key, value in r.metadata.items():
            if drop_keys is not None and key.startswith(drop_keys):
                continue
            if key == "general.architecture" and arch is not None:
                value = arch
            w.add_metadata(key, value, r.metadata_types[key])
        for name, info in r.tensors.items():
            if name != drop:
                w.add_tensor(name, np.array(r.tensor(name)), info.ggml_type, shape=info.shape)
        w.write()
    return dst


def _refused(model: str, **kwargs) -> str:
    from vllm import LLM

    start = time.monotonic()
    with pytest.raises(ValueError) as e:
        LLM(model, enforce_eager=True, enable_prefix_caching=False, **kwargs)
    assert time.monotonic() - start < 60, "refused only after the engine started"
    return str(e.value)


def test_other_architecture(tiny: Path, tmp_path: Path) -> None:
    bad = _rewrite(tiny, tmp_path / "llama.gguf", arch="llama")
    msg = _refused(str(bad))
    assert str(bad) in msg and "architecture 'llama' is not supported" in msg


def test_missing_tensor(tiny: Path, tmp_path: Path) -> None:
    bad = _rewrite(tiny, tmp_path / "missing.gguf", drop="blk.2.ffn_down.weight")
    msg = _refused(str(bad))
    assert str(bad) in msg and "blk.2.ffn_down.weight is missing" in msg


def test_corrupt_file(tiny: Path, tmp_path: Path) -> None:
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(tiny.read_bytes()[: tiny.stat().st_size // 2])
    msg = _refused(str(bad))
    assert str(bad) in msg and "truncated" in msg


def test_no_such_file(tmp_path: Path) -> None:
    msg = _refused(str(tmp_path / "absent.gguf"))
    assert "absent.gguf" in msg and "no such GGUF file" in msg


def test_wrong_quantization_flag(tiny: Path) -> None:
    msg = _refused(str(tiny), quantization="fp8")
    assert "--quantization fp8" in msg and str(tiny) in msg


def test_float_tensor_stored_ternary(tiny: Path, tmp_path: Path) -> None:
    """A float-only tensor (ssm_a) stored in a ternary type is refused."""
    from vllm_prism.gguf.codecs import pack_blocks

    dst = tmp_path / "ternary_norm.gguf"
    with GGUFReader(tiny) as r:
        w = GGUFWriter(dst)
        for key, value in r.metadata.items():
            w.add_metadata(key, value, r.metadata_types[key])
        for name, info in r.tensors.items():
            if name == "output_norm.weight":  # 256 floats -> 2 PQ2_0 blocks
                q = np.zeros((1, 256), np.int8)
                d = np.ones((1, 2), np.float16)
                w.add_tensor(name, pack_blocks(q, d, GGMLType.PQ2_0), GGMLType.PQ2_0,
                             shape=(256,))
            else:
                w.add_tensor(name, np.array(r.tensor(name)), info.ggml_type, shape=info.shape)
        w.write()
    msg = _refused(str(dst))
    assert "output_norm.weight has type PQ2_0 but the model needs it in float" in msg


@pytest.fixture(scope="module")
def no_tokenizer(tiny: Path, tmp_path_factory) -> Path:
    return _rewrite(tiny, tmp_path_factory.mktemp("notok") / "notok.gguf",
                    drop_keys="tokenizer.")


def test_file_without_tokenizer_is_refused_alone(no_tokenizer: Path) -> None:
    msg = _refused(str(no_tokenizer))
    assert str(no_tokenizer) in msg and "--tokenizer" in msg


def test_file_without_tokenizer_serves_with_one_given(tiny: Path, no_tokenizer: Path,
                                                      tmp_path: Path) -> None:
    """--tokenizer DIR or skip_tokenizer_init: the file needs no tokenizer of its own, and
    gives the same tokens as the file that has one (one engine per subprocess)."""
    from vllm_prism.engine.arg_utils import materialize_tokenizer

    from .test_llm import run_vllm

    request = {"prompts": [[5, 17, 42, 99]], "max_tokens": 6, "score": [],
               "detokenize": False}
    want = run_vllm(tiny, request, tmp_path)["greedy"]
    with_dir = {**request, "llm": {"tokenizer": materialize_tokenizer(tiny)}}
    assert run_vllm(no_tokenizer, with_dir, tmp_path)["greedy"] == want
    skipped = {**request, "llm": {"skip_tokenizer_init": True}}
    assert run_vllm(no_tokenizer, skipped, tmp_path)["greedy"] == want
