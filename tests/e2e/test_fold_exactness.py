"""One folded layer through the serving path (loader rows -> prism linear method) against
the oracle's un-folded primal weight (tests/e2e/oracle.py): y = W_primal x. The same check
with one wrong sign, the wrong Hadamard block size or an untransformed input must fail, so
a wrong transform cannot hide behind the tiny model's decisive greedy tokens."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from . import oracle

pytest.importorskip("vllm")

LAYER = "model.layers.0.mlp.down_proj.weight"  # input width 512 (intermediate)
TOL = 1e-4  # fp32 arithmetic on both sides


@pytest.fixture(scope="module")
def case(tiny_gguf):
    from vllm_prism.model_executor.layers.quantization.prism import PrismConfig
    from vllm_prism.model_executor.model_loader.gguf_loader import iterate_gguf_weights
    from vllm_prism.gguf.constants import GGMLType

    path = tiny_gguf("pq2_0", seed=7)
    raw = next(t for n, t in iterate_gguf_weights(str(path)) if n == LAYER)
    _, state = oracle.unfold_gguf(path)
    cfg = PrismConfig(int(GGMLType.PQ2_0), 128, 128, str(path))
    x = torch.randn(5, 512, generator=torch.Generator().manual_seed(0))
    return raw, state[LAYER].double(), cfg, x


def _serve(raw, cfg, x, signs=None) -> torch.Tensor:
    from vllm_prism.model_executor.layers.quantization.prism import (PrismLinearMethod,
                                                                     prism_linear_reference)

    method = PrismLinearMethod(cfg)
    layer = torch.nn.Module()
    method.create_weights(layer, 512, [raw.shape[0]], 512, raw.shape[0], torch.float32)
    layer.weight.data.copy_(raw)
    if signs is not None:
        layer.prism_signs = signs
    return prism_linear_reference(x, layer.weight, layer.prism_signs, cfg).double()


def _err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).norm() / want.norm())


def test_serving_path_equals_primal_weight(case) -> None:
    raw, primal, cfg, x = case
    assert _err(_serve(raw, cfg, x), x.double() @ primal.T) < TOL


def test_wrong_transforms_are_caught(case) -> None:
    from vllm_prism.model_executor.layers.quantization.prism import PrismConfig

    raw, primal, cfg, x = case
    want = x.double() @ primal.T
    signs = torch.from_numpy(np.array(cfg.signs_for(512)))
    flipped = signs.clone()
    flipped[7] = -flipped[7]
    assert _err(_serve(raw, cfg, x, signs=flipped), want) > 100 * TOL
    block64 = PrismConfig(int(cfg.ggml_type), 128, 64, cfg.gguf_path)
    assert _err(_serve(raw, block64, x), want) > 100 * TOL
    unrotated = PrismConfig(int(cfg.ggml_type), 128, None, cfg.gguf_path)
    assert _err(_serve(raw, unrotated, x), want) > 100 * TOL
