"""The prism linear method under torch.compile the way vLLM compiles a model: one Dynamo
trace with ``fullgraph=True``, the token dimension dynamic, every guard dropped (vLLM's
``guard_filter_fn``), then reused for every batch size.

It catches, without a GPU, what broke vLLM's default mode on CUDA: code Dynamo cannot trace
(a logger call, an opaque Python object built in the forward), a kernel choice frozen at the
first traced M, and an M specialised to a constant. The op must appear in the graph as one
opaque node (``torch.ops.vllm_prism.pq2_linear``) and give the eager result at M = 512, 1
and 7 from the graph traced at M = 512.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("vllm")

from vllm_prism.gguf import codecs  # noqa: E402
from vllm_prism.gguf.constants import GGMLType  # noqa: E402

K, N = 256, 384


def _layer(tiny_gguf, fmt: str):
    from vllm_prism.model_executor.layers.quantization.prism import (PrismConfig,
                                                                     PrismLinearMethod)

    ggml_type = {"pq2_0": GGMLType.PQ2_0, "ptq1_0": GGMLType.PTQ1_0}[fmt]
    cfg = PrismConfig(int(ggml_type), 128, 128, str(tiny_gguf(fmt)))
    method = PrismLinearMethod(cfg)
    layer = torch.nn.Module()
    method.create_weights(layer, K, [N], K, N, torch.bfloat16)
    rng = np.random.default_rng(3)
    q = rng.integers(-1, 2, size=(N, K), dtype=np.int8)
    d = rng.uniform(0.01, 0.03, size=(N, K // 128)).astype(np.float16)
    raw = torch.from_numpy(codecs.pack_blocks(q, d, ggml_type))
    layer.weight.data.copy_(raw)
    dense = torch.from_numpy(q.astype(np.float32) * np.repeat(d.astype(np.float32), 128, 1))
    signs = layer.prism_signs.clone()
    method.process_weights_after_loading(layer)
    return method, layer, dense, signs


def _compile_like_vllm(fn):
    """``fn`` compiled as vLLM compiles a model (one Dynamo trace, fullgraph, every guard
    dropped); returns it and the list the traced graphs land in."""
    graphs: list[torch.fx.GraphModule] = []

    def backend(gm: torch.fx.GraphModule, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, backend=backend, dynamic=False,
                             options={"guard_filter_fn": lambda guards: [False] * len(guards)})
    return compiled, graphs


def _mark_tokens_dynamic(m: int, *tensors: torch.Tensor) -> None:
    """The first (tracing) call, M = 512, marks the token dimension dynamic."""
    if m == 512:
        for t in tensors:
            torch._dynamo.mark_dynamic(t, 0)


def _reference(x: torch.Tensor, dense: torch.Tensor, signs: torch.Tensor) -> torch.Tensor:
    """y = W · Hblk(s ⊙ x) with an explicit Sylvester matrix (float64)."""
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < 128:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    h = h / h.shape[0] ** 0.5
    xs = (x.double() * signs.double()).reshape(x.shape[0], -1, 128) @ h.T
    return xs.reshape(x.shape[0], -1) @ dense.double().T


@pytest.mark.parametrize("fmt", ["pq2_0", "ptq1_0"])
def test_linear_compiles_once_for_every_batch_size(tiny_gguf, fmt: str) -> None:
    method, layer, dense, signs = _layer(tiny_gguf, fmt)
    def forward(x: torch.Tensor) -> torch.Tensor:
        return method.apply(layer, x) * 2.0

    compiled, graphs = _compile_like_vllm(forward)
    gen = torch.Generator().manual_seed(0)
    for m in (512, 1, 7):
        x = torch.randn(m, K, generator=gen).to(torch.bfloat16)
        _mark_tokens_dynamic(m, x)
        got = compiled(x)
        want = forward(x)
        assert got.shape == (m, N)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        ref = _reference(x, dense, signs) * 2.0
        err = (got.double() - ref).norm() / ref.norm()
        assert err < 1e-2, (m, float(err))
    assert len(graphs) == 1, f"{len(graphs)} graphs traced: M was specialised"
    ops = [n.target for n in graphs[0].graph.nodes if n.op == "call_function"]
    op = torch.ops.vllm_prism.pq2_linear
    assert op in ops or op.default in ops, ops


@pytest.mark.parametrize("code3", [False, True])
def test_ternary_record_reaches_the_compiled_op(tiny_gguf, monkeypatch, code3: bool) -> None:
    """The planes' ternary record (wgmma_fold's 127 scale levels) survives the layer's
    preparation (the layer holds a Parameter over the checked plane) and reaches the op
    called from the compiled graph; a layer whose codes hold a 3 is not taken for ternary."""
    import gc

    from vllm_prism.kernels.pq2 import dispatch

    method, layer = _layer_kn(tiny_gguf, K, N, code3=code3)
    gc.collect()
    seen: list[bool] = []
    run = dispatch.pq2_linear

    def recording(x, w, bias=None):
        seen.append(w.is_ternary())
        return run(x, w, bias)

    monkeypatch.setattr(dispatch, "pq2_linear", recording)
    compiled, _ = _compile_like_vllm(lambda x: method.apply(layer, x))
    for m in (512, 1):
        x = torch.randn(m, K).to(torch.bfloat16)
        _mark_tokens_dynamic(m, x)
        compiled(x)
    assert seen and all(t is (not code3) for t in seen), seen


def test_ptq1_keeps_one_prepared_form(tiny_gguf) -> None:
    """PTQ1_0 is transcoded once at load: the layer holds the PQ2 planes and no GGUF rows."""
    _, layer, _, _ = _layer(tiny_gguf, "ptq1_0")
    assert layer.weight.numel() == 0
    assert layer.prism_codes.dtype == torch.int32 and layer.prism_codes.shape == (N, K // 16)
    tensors = [t for t in (*layer.parameters(), *layer.buffers()) if t is not None]
    held = sum(t.numel() * t.element_size() for t in tensors)
    # codes (K/4 bytes a row) + fp16 scales padded to 8 + fp32 signs
    assert held == N * K // 4 + N * 8 * 2 + K * 4


def test_fused_norm_and_activation_compile_and_match_vllms_ops(tiny_gguf) -> None:
    """The MLP's fused path (residual add + RMSNorm in gate_up's producer, SiLU-and-multiply in
    down's) traces into one graph of two opaque ops and equals vLLM's own GemmaRMSNorm and
    SiluAndMul followed by the plain linear op, at M = 512, 1 and 7."""
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.activation import SiluAndMul
    from vllm.model_executor.layers.layernorm import GemmaRMSNorm

    method, up = _layer_kn(tiny_gguf, K, 2 * K)  # gate_up: intermediate size K
    down_method, down = _layer_kn(tiny_gguf, K, K)
    with set_current_vllm_config(VllmConfig()):
        norm, silu_mul = GemmaRMSNorm(K, eps=1e-6), SiluAndMul()
    with torch.no_grad():
        norm.weight.copy_(torch.randn(K, generator=torch.Generator().manual_seed(5)) * 0.3)
    assert method.fuses_prologue(up) and down_method.fuses_prologue(down)
    def fused(x: torch.Tensor, res: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        gate_up, res = method.apply_add_rmsnorm(up, x, res, norm.weight, 1.0, 1e-6)
        return down_method.apply_glu(down, gate_up), res

    def unfused(x: torch.Tensor, res: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h, res = norm.forward_native(x, res)
        gate_up = method.apply(up, h)
        return down_method.apply(down, silu_mul.forward_native(gate_up)), res

    compiled, graphs = _compile_like_vllm(fused)
    gen = torch.Generator().manual_seed(1)
    for m in (512, 1, 7):
        x, res = (torch.randn(m, K, generator=gen) for _ in range(2))
        _mark_tokens_dynamic(m, x, res)
        y, r = compiled(x, res)
        y_ref, r_ref = unfused(x, res)
        torch.testing.assert_close(r, r_ref, rtol=0, atol=0)
        err = (y.double() - y_ref.double()).norm() / y_ref.double().norm()
        assert y.shape == (m, K) and err < 1e-5, (m, float(err))
    assert len(graphs) == 1, f"{len(graphs)} graphs traced: M was specialised"
    ops = {str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"}
    assert any("pq2_add_rmsnorm_linear" in o for o in ops), ops
    assert any("pq2_glu_linear" in o for o in ops), ops


def _layer_kn(tiny_gguf, k: int, n: int, code3: bool = False):
    """A PQ2_0 prism linear layer [n, k] with random ternary weights (with some of the code
    3, +2, where ``code3``), prepared for the op."""
    from vllm_prism.model_executor.layers.quantization.prism import (PrismConfig,
                                                                     PrismLinearMethod)

    cfg = PrismConfig(int(GGMLType.PQ2_0), 128, 128, str(tiny_gguf("pq2_0")))
    method = PrismLinearMethod(cfg)
    layer = torch.nn.Module()
    method.create_weights(layer, k, [n], k, n, torch.float32)
    rng = np.random.default_rng(k + n)
    q = rng.integers(-1, 3 if code3 else 2, size=(n, k), dtype=np.int8)
    d = rng.uniform(0.01, 0.03, size=(n, k // 128)).astype(np.float16)
    layer.weight.data.copy_(torch.from_numpy(codecs.pack_blocks(q, d, GGMLType.PQ2_0)))
    layer.bias = None
    method.process_weights_after_loading(layer)
    return method, layer


def test_gated_output_projections_compile_and_match_vllms_ops(tiny_gguf) -> None:
    """o_proj's sigmoid gate and the Gated DeltaNet's gated per-head RMSNorm (vLLM's
    RMSNormGated, heads of 64, silu gate) in the producer: one graph, vLLM's result."""
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.layernorm import RMSNormGated

    method, layer = _layer_kn(tiny_gguf, K, K)
    with set_current_vllm_config(VllmConfig()):
        norm = RMSNormGated(64, eps=1e-6, group_size=None, norm_before_gate=True,
                            device="cpu")
    with torch.no_grad():
        norm.weight.copy_(torch.rand(64, generator=torch.Generator().manual_seed(6)) + 0.5)
    def fused(x: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a = method.apply_gated(layer, x, z, gate_sigmoid=True)
        b = method.apply_gated(layer, x, z, gate_sigmoid=False, rms_weight=norm.weight,
                               rms_group=64, eps=1e-6)
        return a, b

    def unfused(x: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a = method.apply(layer, x * torch.sigmoid(z))
        h = norm.forward_native(x.view(x.shape[0], -1, 64), z.view(x.shape[0], -1, 64))
        return a, method.apply(layer, h.reshape(x.shape))

    compiled, graphs = _compile_like_vllm(fused)
    gen = torch.Generator().manual_seed(2)
    for m in (512, 1, 7):
        x, z = (torch.randn(m, K, generator=gen) for _ in range(2))
        _mark_tokens_dynamic(m, x, z)
        for got, want in zip(compiled(x, z), unfused(x, z)):
            err = (got.double() - want.double()).norm() / want.double().norm()
            assert got.shape == (m, K) and err < 1e-5, (m, float(err))
    assert len(graphs) == 1, f"{len(graphs)} graphs traced: M was specialised"
    ops = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert sum("pq2_gated_linear" in o for o in ops) == 2, ops
