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


def test_tiny_drafter_extra_layers_pass_through(tiny_gguf, tmp_path) -> None:
    """--layers 5 --sliding-window W: five layers, every one sliding-window attention of
    width W (dflash_config), and layers 1..4 add nothing to the residual stream."""
    import json

    pytest.importorskip("safetensors")
    from safetensors.torch import load_file

    from vllm_prism.spec_decode.tiny_drafter import make_tiny_drafter

    out = make_tiny_drafter(tmp_path / "d", tiny_gguf("pq2_0", seed=7), layers=5,
                            sliding_window=128)["path"]
    cfg = json.loads((tmp_path / "d" / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 5
    assert cfg["dflash_config"]["use_swa"] and cfg["dflash_config"]["swa_window_size"] == 128
    w = load_file(f"{out}/model.safetensors")
    assert w["layers.0.self_attn.o_proj.weight"].abs().sum() > 0
    for i in range(1, 5):
        for name in ("self_attn.o_proj.weight", "mlp.down_proj.weight"):
            assert not w[f"layers.{i}.{name}"].any(), (i, name)
        assert w[f"layers.{i}.input_layernorm.weight"].shape == w[
            "layers.0.input_layernorm.weight"].shape
