"""What a .gguf model does to vLLM's engine arguments, before any engine starts."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest

pytest.importorskip("vllm")

from vllm_prism.engine.arg_utils import materialize_tokenizer, prepare_gguf_engine_args  # noqa: E402


def _args(model: str, **kw) -> types.SimpleNamespace:
    base = dict(model=model, quantization=None, config_format="auto", load_format="auto",
                tokenizer=None, served_model_name=None, attention_backend=None,
                attention_config=types.SimpleNamespace(backend=None))
    base.update(kw)
    return types.SimpleNamespace(**base)


@pytest.fixture(scope="module")
def tiny(tiny_gguf) -> Path:
    return tiny_gguf()


def test_gguf_selects_our_components(tiny: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("VLLM_PRISM_CACHE_DIR", str(tmp_path))
    args = _args(str(tiny))
    prepare_gguf_engine_args(args)
    assert (args.quantization, args.config_format, args.load_format) == (
        "prism", "prism_gguf", "prism_gguf")
    assert args.served_model_name == str(tiny)
    tok_dir = Path(args.tokenizer)
    assert tok_dir.is_relative_to(tmp_path)
    config = json.loads((tok_dir / "tokenizer_config.json").read_text())
    assert config["eos_token"] == "<|im_end|>" and "add_generation_prompt" in config[
        "chat_template"]
    assert args.attention_backend is None  # CPU: the PRISM backend is for CUDA


def test_user_tokenizer_is_kept(tiny: Path) -> None:
    args = _args(str(tiny), tokenizer="/my/tokenizer")
    prepare_gguf_engine_args(args)
    assert args.tokenizer == "/my/tokenizer"


def test_other_models_are_left_alone() -> None:
    args = _args("Qwen/Qwen3-0.6B")
    prepare_gguf_engine_args(args)
    assert (args.quantization, args.load_format, args.tokenizer) == (None, "auto", None)


def test_prism_quantization_needs_a_gguf() -> None:
    with pytest.raises(ValueError, match="--quantization prism needs a Bonsai .gguf"):
        prepare_gguf_engine_args(_args("Qwen/Qwen3-0.6B", quantization="prism"))


def test_tokenizer_folder_is_cached(tiny: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("VLLM_PRISM_CACHE_DIR", str(tmp_path))
    first = materialize_tokenizer(tiny)
    stamp = (Path(first) / "tokenizer.json").stat().st_mtime_ns
    assert materialize_tokenizer(tiny) == first
    assert (Path(first) / "tokenizer.json").stat().st_mtime_ns == stamp
