"""vLLM 0.32's DFlash context K/V projection with a quantized drafter: checked, not patched.

``DFlashQwen3Model._build_context_kv_buffers`` stacks the layers' ``qkv_proj.weight`` into one
fused GEMM only when every projection is unquantized, and otherwise runs each layer's
projection through its own quant method (``_project_context_kv``). This checks both paths on
vLLM's own code: the per-layer path over prism-quantized (ternary, Hadamard-folded) weights
equals the fused path over the same weights dequantized and un-folded, so a quantized drafter
needs no patch for its context K/V (issue: quantized drafter context projection).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("vllm")
dflash = pytest.importorskip("vllm.model_executor.models.qwen3_dflash")

from vllm.model_executor.layers.linear import UnquantizedLinearMethod  # noqa: E402

from vllm_prism.gguf import codecs  # noqa: E402
from vllm_prism.gguf.constants import GGMLType  # noqa: E402
from vllm_prism.gguf.hadamard import primal_weight  # noqa: E402

HIDDEN, Q, KV_HEADS, HEAD_DIM, LAYERS = 256, 256, 2, 64, 3
KV = 2 * KV_HEADS * HEAD_DIM


class _Proj(torch.nn.Module):
    """The slice of vLLM's QKVParallelLinear the precompute reads: weight, bias,
    quant_method and a forward returning (output, bias)."""

    def __init__(self, method, layer: torch.nn.Module | None, weight: torch.Tensor) -> None:
        super().__init__()
        self.quant_method = method
        self.layer = layer
        self.weight = weight
        self.bias = None

    def forward(self, x: torch.Tensor):
        if isinstance(self.quant_method, UnquantizedLinearMethod):
            return torch.nn.functional.linear(x, self.weight), None
        return self.quant_method.apply(self.layer, x), None


def _prism_layer(tiny_gguf, seed: int):
    from vllm_prism.model_executor.layers.quantization.prism import (PrismConfig,
                                                                     PrismLinearMethod)

    cfg = PrismConfig(int(GGMLType.PQ2_0), 128, 128, str(tiny_gguf("pq2_0")))
    method = PrismLinearMethod(cfg)
    layer = torch.nn.Module()
    method.create_weights(layer, HIDDEN, [Q + KV], HIDDEN, Q + KV, torch.float32)
    rng = np.random.default_rng(seed)
    q = rng.integers(-1, 2, size=(Q + KV, HIDDEN), dtype=np.int8)
    d = rng.uniform(0.02, 0.05, size=(Q + KV, HIDDEN // 128)).astype(np.float16)
    layer.weight.data.copy_(torch.from_numpy(codecs.pack_blocks(q, d, GGMLType.PQ2_0)))
    signs = layer.prism_signs.numpy().copy()
    w_st = q.astype(np.float64) * np.repeat(d.astype(np.float64), 128, axis=1)
    method.process_weights_after_loading(layer)
    # y = W_st Hblk(s x) = W x with W = primal(W_st): the unquantized twin's weight
    dense = torch.from_numpy(primal_weight(w_st, signs, 128)).float()
    return method, layer, dense


def _model(projs: list[_Proj]):
    model = object.__new__(dflash.DFlashQwen3Model)
    torch.nn.Module.__init__(model)
    model.hidden_norm = torch.nn.Module()
    model.hidden_norm.weight = torch.nn.Parameter(torch.rand(HIDDEN) + 0.5)
    attn = [type("Attn", (), {"qkv_proj": p, "q_size": Q,
                              "k_norm": type("N", (), {"weight": torch.nn.Parameter(
                                  torch.ones(HEAD_DIM))})()})() for p in projs]
    model._build_context_kv_buffers(attn, has_bias=False)
    model._rms_norm_eps = 1e-6
    return model


def test_quantized_drafter_context_kv_equals_the_fused_path(tiny_gguf) -> None:
    quant, dense = [], []
    for i in range(LAYERS):
        method, layer, w = _prism_layer(tiny_gguf, seed=i)
        quant.append(_Proj(method, layer, layer.weight))
        dense.append(_Proj(UnquantizedLinearMethod(), None, w))
    fused = _model(dense)
    per_layer = _model(quant)
    assert fused._fused_kv_weight is not None  # vLLM fuses unquantized projections
    assert per_layer._fused_kv_weight is None  # and runs quantized ones one by one
    per_layer.hidden_norm.weight = fused.hidden_norm.weight
    per_layer._hidden_norm_weight = fused._hidden_norm_weight
    x = torch.randn(7, HIDDEN, generator=torch.Generator().manual_seed(0))
    k0, v0 = fused._project_context_kv(x, 7, LAYERS, KV_HEADS, HEAD_DIM)
    k1, v1 = per_layer._project_context_kv(x, 7, LAYERS, KV_HEADS, HEAD_DIM)
    for a, b in ((k0, k1), (v0, v1)):
        assert a.shape == (LAYERS, 7, KV_HEADS, HEAD_DIM)
        assert float((a - b).norm() / a.norm()) < 1e-4
