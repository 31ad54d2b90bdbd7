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


def _on_cuda(monkeypatch, flashinfer: bool) -> None:
    import importlib.util

    from vllm.platforms import current_platform

    monkeypatch.setattr(type(current_platform), "is_cuda", lambda self: True)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: (object() if flashinfer else None)
                        if name == "flashinfer" else real(name, *a))


@pytest.mark.parametrize("flashinfer", [False, True])
def test_cuda_selects_backends(tiny: Path, tmp_path: Path, monkeypatch,
                               flashinfer: bool) -> None:
    """On CUDA: our attention backend as vLLM's CUSTOM member (every vLLM process can
    unpickle it), and Triton Gated DeltaNet prefill only where FlashInfer is absent."""
    monkeypatch.setenv("VLLM_PRISM_CACHE_DIR", str(tmp_path))
    _on_cuda(monkeypatch, flashinfer)
    args = _args(str(tiny), additional_config={}, gdn_prefill_backend=None)
    prepare_gguf_engine_args(args)
    assert args.attention_backend == "CUSTOM"
    assert args.gdn_prefill_backend == (None if flashinfer else "triton")


@pytest.mark.parametrize("kv,spec,expected", [
    # vLLM would pick its own Triton attention for an INT8 draft: ours instead
    ("int8_per_token_head", {"method": "dflash", "model": "d"}, "CUSTOM"),
    # a 16-bit draft cache (the target's or the speculative config's own): vLLM's choice
    ("auto", {"method": "dflash", "model": "d"}, None),
    ("int8_per_token_head", {"method": "dflash", "model": "d", "kv_cache_dtype": "auto"},
     None),
    # a backend the user named for the draft stays
    ("int8_per_token_head", {"method": "dflash", "model": "d",
                             "attention_backend": "TRITON_ATTN"}, "TRITON_ATTN"),
])
def test_cuda_selects_the_drafter_backend(tiny: Path, tmp_path: Path, monkeypatch, kv: str,
                                          spec: dict, expected: str | None) -> None:
    """The drafter's attention backend (vLLM selects it apart from the target's): by default
    (``VLLM_PRISM_DRAFT_ATTENTION=prism``) ours for an INT8 draft cache; with ``vllm``
    vLLM's choice stands."""
    monkeypatch.setenv("VLLM_PRISM_CACHE_DIR", str(tmp_path))
    _on_cuda(monkeypatch, flashinfer=False)
    args = _args(str(tiny), additional_config={}, gdn_prefill_backend=None, kv_cache_dtype=kv,
                 speculative_config=dict(spec))
    monkeypatch.setenv("VLLM_PRISM_DRAFT_ATTENTION", "vllm")
    prepare_gguf_engine_args(args)
    assert args.speculative_config == spec  # vllm: vLLM selects
    monkeypatch.delenv("VLLM_PRISM_DRAFT_ATTENTION")  # the default: prism
    given = dict(spec)
    args = _args(str(tiny), additional_config={}, gdn_prefill_backend=None, kv_cache_dtype=kv,
                 speculative_config=given)
    prepare_gguf_engine_args(args)
    assert args.speculative_config.get("attention_backend") == expected
    assert given == spec  # the caller's dict is not changed
    # vLLM parses the value into the enum member every process can unpickle
    if expected == "CUSTOM":
        from vllm.config import SpeculativeConfig
        from vllm.v1.attention.backends.registry import AttentionBackendEnum

        assert SpeculativeConfig._parse_attention_backend(expected) is \
            AttentionBackendEnum.CUSTOM
    # a target backend chosen by the user: the drafter is left to vLLM
    args = _args(str(tiny), attention_backend="FLASH_ATTN", additional_config={},
                 gdn_prefill_backend=None, kv_cache_dtype=kv, speculative_config=dict(spec))
    prepare_gguf_engine_args(args)
    assert args.speculative_config.get("attention_backend") == spec.get("attention_backend")


def test_switch_choices_start_with_the_default(monkeypatch) -> None:
    from vllm_prism import envs

    for name, allowed in envs.CHOICES.items():
        monkeypatch.delenv(name, raising=False)
        assert getattr(envs, name) == allowed[0], name


def test_bad_switch_values_are_refused(tiny: Path, monkeypatch) -> None:
    from vllm_prism import envs

    assert set(envs.CHOICES) == {"VLLM_PRISM_ATTN_DECODE_COPY", "VLLM_PRISM_ATTN_DECODE_SPLIT",
                                 "VLLM_PRISM_ATTN_VERIFY_FORM", "VLLM_PRISM_DENSE_GEMV",
                                 "VLLM_PRISM_DRAFT_ATTENTION", "VLLM_PRISM_GDN_VERIFY"}
    for name in envs.CHOICES:
        monkeypatch.setenv(name, "fast")
        with pytest.raises(ValueError, match=f"{name}='fast': use one of"):
            prepare_gguf_engine_args(_args(str(tiny)))
        monkeypatch.delenv(name)


def test_cuda_keeps_user_choices(tiny: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("VLLM_PRISM_CACHE_DIR", str(tmp_path))
    _on_cuda(monkeypatch, flashinfer=False)
    args = _args(str(tiny), attention_backend="FLASH_ATTN",
                 additional_config={"gdn_prefill_backend": "flashinfer"},
                 gdn_prefill_backend=None)
    prepare_gguf_engine_args(args)
    assert args.attention_backend == "FLASH_ATTN" and args.gdn_prefill_backend is None
    args = _args(str(tiny), attention_backend="PRISM", additional_config={},
                 gdn_prefill_backend="cutedsl")
    prepare_gguf_engine_args(args)
    assert args.attention_backend == "CUSTOM" and args.gdn_prefill_backend == "cutedsl"


def test_tokenizer_folder_has_a_config(tiny: Path, tmp_path: Path, monkeypatch) -> None:
    """vLLM reads a model config from the tokenizer path; a folder without one costs two
    logged errors and a retry sleep at every start."""
    from vllm.transformers_utils.config import get_config

    monkeypatch.setenv("VLLM_PRISM_CACHE_DIR", str(tmp_path))
    config = get_config(materialize_tokenizer(tiny), trust_remote_code=False,
                        config_format="hf")
    assert config.model_type == "qwen3_5_text" and config.hidden_size == 256


def test_relative_model_path_is_resolved(tiny: Path, tmp_path: Path, monkeypatch) -> None:
    """vLLM would look a relative path up on the model hub first (slow offline)."""
    monkeypatch.setenv("VLLM_PRISM_CACHE_DIR", str(tmp_path))
    monkeypatch.chdir(tiny.parent)
    args = _args(tiny.name)
    prepare_gguf_engine_args(args)
    assert args.model == str(tiny.resolve()) and Path(args.model).is_absolute()
    assert args.served_model_name == tiny.name  # what the user called it


def test_bad_gemv_tuning_is_refused_before_the_engine(tiny: Path, monkeypatch) -> None:
    """VLLM_PRISM_GEMV_TUNING is parsed when the engine arguments are prepared: a bad value
    names the variable there, not at the first GEMV inside the engine."""
    monkeypatch.setenv("VLLM_PRISM_GEMV_TUNING", "depth=2,speed=9")
    with pytest.raises(ValueError, match="VLLM_PRISM_GEMV_TUNING=.*'speed=9'"):
        prepare_gguf_engine_args(_args(str(tiny), tokenizer="/my/tokenizer"))
