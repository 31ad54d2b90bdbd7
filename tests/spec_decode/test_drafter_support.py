"""What a speculative drafter next to a Bonsai GGUF target needs from vllm-prism: the target
exposes the hidden states after chosen layers (vLLM's EAGLE-3 interface, which DFlash uses),
and a drafter in Hugging Face format, which inherits the target's load format, is loaded by
vLLM's default loader rather than the GGUF one."""

from __future__ import annotations

import types

import pytest

pytest.importorskip("vllm")


def test_target_offers_aux_hidden_states() -> None:
    from vllm.model_executor.models.interfaces import supports_eagle3
    from vllm.model_executor.models.qwen3_next import Qwen3NextModel

    from vllm_prism.model_executor.models.bonsai import BonsaiModel, PrismBonsaiForCausalLM

    assert supports_eagle3(PrismBonsaiForCausalLM)
    assert issubclass(BonsaiModel, Qwen3NextModel)
    assert hasattr(BonsaiModel, "_set_aux_hidden_state_layers")


def test_hf_drafter_goes_to_the_default_loader(monkeypatch) -> None:
    from vllm.config.load import LoadConfig
    from vllm.model_executor.model_loader import get_model_loader
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader

    from vllm_prism.model_executor.model_loader.gguf_loader import register_gguf_loader
    from vllm_prism.transformers_utils.gguf_config import LOAD_FORMAT

    register_gguf_loader()
    calls = []
    monkeypatch.setattr(DefaultModelLoader, "load_weights",
                        lambda self, model, cfg: calls.append(self.load_config.load_format))
    loader = get_model_loader(LoadConfig(load_format=LOAD_FORMAT))
    drafter = types.SimpleNamespace(hf_config=types.SimpleNamespace(quantization_config=None))
    loader.load_weights(object(), drafter)
    assert calls == ["auto"]
    target = types.SimpleNamespace(hf_config=types.SimpleNamespace(
        quantization_config={"gguf_path": "/nonexistent/x.gguf"}))
    with pytest.raises(Exception):  # the GGUF path: it reads the (absent) file itself
        loader.load_weights(object(), target)
    assert calls == ["auto"]
