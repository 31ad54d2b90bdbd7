"""The GEMV with the activation producer in its launch (``gemv_fused_cuda``, op
``pq2_gemv_fused`` of csrc/pq2/gemv_int8.cu) on the GPU.

Each prologue the model feeds a linear (the MLP's SiLU-and-multiply, the residual add with the
zero-centred RMSNorm, the attention output's sigmoid gate, the Gated DeltaNet output's per-head
norm with its SiLU gate, none) against an fp64 reference written here (the prologue in torch,
then ``gguf.hadamard.forward_transform`` and the dense weight), and against the unfused path
(the Triton producer, then ``gemv_cuda``), which makes the same int8 activation but for a rare
rounding step: outputs within 5e-3, the written-back residual bit for bit.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pq2_reference import (dense, prologue_reference, random_signs, random_ternary,
                           reference_linear, rel_err)

from vllm_prism.kernels.pq2 import dispatch
from vllm_prism.kernels.pq2.hadamard import Prologue
from vllm_prism.kernels.pq2.layout import PQ2Weight

pytestmark = pytest.mark.gpu

FUSED = dispatch.GemvFusedCudaKernel
UNFUSED = dispatch.GemvCudaA8Kernel


def _need_fused() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    ok, why = FUSED.is_supported(torch.cuda.get_device_capability())
    if not ok:
        pytest.skip(f"gemv_fused_cuda: {why}")


def _case(n: int, k: int, block: int | None, seed: int):
    gen = torch.Generator().manual_seed(seed)
    raw, _, _ = random_ternary(n, k, "PQ2_0", gen, "cuda")
    signs = random_signs(k, gen, "cuda") if block else None
    return raw, signs, PQ2Weight.from_raw(raw, signs, block), gen


def _row(gen: torch.Generator, width: int, dtype: torch.dtype, scale: float = 1.0,
         offset: int = 0) -> torch.Tensor:
    """A [1, width] row; ``offset`` > 0: a view that many elements into a wider buffer (not
    16-byte aligned: the kernel's element-wise loads)."""
    buf = (torch.randn(1, width + offset, generator=gen) * scale).to("cuda", dtype)
    return buf[:, offset:]


def check(n: int, k: int, block: int | None, make_pro, dtype=torch.bfloat16, bias=False,
          offset: int = 0, seed: int = 0) -> None:
    _need_fused()
    raw, signs, w, gen = _case(n, k, block, seed)
    pro, width = make_pro(gen, k, dtype, offset)
    x = _row(gen, width, dtype, offset=offset)
    b = torch.randn(n, generator=gen).to("cuda", dtype) if bias else None
    assert FUSED.can_implement(dispatch.PQ2LinearConfig.of(1, w, dtype, pro))[0]

    act = FUSED.make_activation(x, w, pro)
    y = FUSED.run(act, w, b, dtype)
    assert y.shape == (1, n) and y.dtype == dtype and torch.isfinite(y).all()
    xp, res = prologue_reference(x, pro, k)
    ref = reference_linear(xp, raw, "PQ2_0", signs, block, b, w_dense=dense(raw, "PQ2_0"))
    err = rel_err(y, ref)
    assert err < 3e-2, f"against the fp64 reference: {err:.2e}"

    y32 = FUSED.run(act, w, b, torch.float32)
    act2 = UNFUSED.make_activation(x.contiguous(), w, pro)
    y2 = UNFUSED.run(act2, w, b, torch.float32)
    err2 = rel_err(y32, y2)
    assert err2 < 5e-3, f"against the Triton producer + gemv_cuda: {err2:.2e}"
    if pro.residual is not None:
        assert act.residual is not None
        assert rel_err(act.residual, res) < 1e-2
        if not pro.glu:
            assert torch.equal(act.residual, act2.residual)


def add_rmsnorm(gen, k, dtype, offset):
    """The decoder layer's residual add and (1 + w) RMSNorm (qkv, gate_up, in_proj)."""
    return Prologue(residual=_row(gen, k, dtype, offset=offset),
                    rms_weight=(torch.randn(k, generator=gen) * 0.1).to("cuda", dtype),
                    rms_offset=1.0, eps=1e-6), k


def glu(gen, k, dtype, offset):
    """The MLP's SiLU-and-multiply (down projection)."""
    return Prologue(glu=True), 2 * k


def sigmoid_gate(gen, k, dtype, offset):
    """The attention output's sigmoid gate (o_proj)."""
    return Prologue(gate=_row(gen, k, dtype, offset=offset), gate_sigmoid=True), k


def head_norm_silu_gate(gen, k, dtype, offset):
    """The Gated DeltaNet output: RMSNorm per 128-value head, times silu(z) (out_proj)."""
    return Prologue(rms_weight=(torch.rand(128, generator=gen) + 0.5).to("cuda", torch.float32),
                    rms_group=128, eps=1e-6, gate=_row(gen, k, dtype, offset=offset)), k


def plain(gen, k, dtype, offset):
    return Prologue(), k


def row_norm_fp32_weight(gen, k, dtype, offset):
    """A plain RMSNorm with an fp32 weight, no residual."""
    return Prologue(rms_weight=torch.rand(k, generator=gen).to("cuda") + 0.5), k


@pytest.mark.parametrize("n,k,make_pro", [
    (12288, 5120, add_rmsnorm), (34816, 5120, add_rmsnorm), (5120, 17408, glu),
    (5120, 6144, sigmoid_gate), (5120, 6144, head_norm_silu_gate), (1024, 5120, plain),
    (300, 2304, row_norm_fp32_weight)], ids=lambda v: getattr(v, "__name__", str(v)))
def test_bonsai_prologues(n: int, k: int, make_pro) -> None:
    """The 27B model's linears with the prologue each one gets in the model (Hadamard block
    1024; 2304 = 9 blocks of 256)."""
    check(n, k, 1024 if k % 1024 == 0 else 256, make_pro, seed=n + k)


@pytest.mark.parametrize("make_pro", [add_rmsnorm, head_norm_silu_gate, glu],
                         ids=lambda f: f.__name__)
def test_unaligned_rows_fp16_bias(make_pro) -> None:
    """x, the residual and the gate one element into their buffers (no 16-byte loads), fp16
    throughout, a bias, a small Hadamard block (128) and rows past a CTA's last warp."""
    check(300, 1280, 128, make_pro, dtype=torch.float16, bias=True, offset=1, seed=5)


@pytest.mark.parametrize("n,k,block", [(8, 32768, 1024), (1000, 1024, None), (96, 384, 32),
                                       (50, 4096, 64)])
def test_widths_and_blocks(n: int, k: int, block: int | None) -> None:
    """The widest K (one 32-value unit for each of 1024 threads), no fold at all, K with a
    partial 1024-value warp (384: 12 units, a 128-group of 4 lanes each), blocks below a lane's
    32 values and across two lanes."""
    check(n, k, block, add_rmsnorm, seed=k)


def test_graph_replay_when_named(monkeypatch) -> None:
    """Named by VLLM_PRISM_PQ2_KERNEL, it runs the M = 1 calls with a prologue; captured in a
    CUDA graph (with programmatic dependent launch where on) and replayed on new inputs, equal
    to eager calls."""
    _need_fused()
    raw, signs, w, gen = _case(4096, 2048, 1024, 9)
    monkeypatch.setenv("VLLM_PRISM_PQ2_KERNEL", "gemv_fused_cuda")
    dispatch._select.cache_clear()
    assert dispatch.select_kernel(1, w, torch.bfloat16) is FUSED
    x, r = (torch.zeros(1, 2048, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    g = (torch.rand(2048, generator=gen) + 0.5).to("cuda", torch.bfloat16)
    pro = Prologue(residual=r, rms_weight=g, rms_offset=1.0)
    dispatch.pq2_linear_fused(x, w, None, pro)  # warm up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y, res, _ = dispatch.pq2_linear_fused(x, w, None, pro)
    for seed in range(3):
        x.copy_(_row(gen, 2048, torch.bfloat16))
        r.copy_(_row(gen, 2048, torch.bfloat16))
        graph.replay()
        want, want_res, _ = dispatch.pq2_linear_fused(x, w, None, pro)
        torch.cuda.synchronize()
        assert torch.equal(y, want) and torch.equal(res, want_res), seed
    dispatch._select.cache_clear()


_REFUSALS = """
import torch
from vllm_prism.kernels.pq2 import dispatch
from vllm_prism.kernels.pq2.layout import PQ2Weight
from pq2_reference import random_signs, random_ternary
assert dispatch.GemvFusedCudaKernel.is_supported(torch.cuda.get_device_capability())[0]
gen = torch.Generator().manual_seed(3)
raw, _, _ = random_ternary(64, 256, "PQ2_0", gen, "cuda")
w = PQ2Weight.from_raw(raw, random_signs(256, gen, "cuda"), 128)
x = torch.randn(1, 256, device="cuda").bfloat16()
def call(x=x, rms_group=0, rms_weight=None, block=128, glu=False):
    return torch.ops._C_prism.pq2_gemv_fused(
        w.codes, w.scales, x, None, None, rms_weight, None, w.signs, None, block, glu, 0.0,
        1e-6, rms_group, False, torch.bfloat16, False)
for kw in [dict(x=x.float()), dict(rms_group=16, rms_weight=torch.ones(16, device="cuda")),
           dict(block=2048), dict(glu=True)]:
    try:
        call(**kw)
    except RuntimeError as e:
        print("refused:", str(e).splitlines()[0])
"""


def test_op_refusals(child_python) -> None:
    """The op names what it cannot take (in a child process: a refusal whose message formats
    an integer crashed the process on the GPU while the extension carried a static C++
    runtime, tests/kernels/test_cmake_runtime.py)."""
    _need_fused()
    r = child_python(_REFUSALS, Path(__file__).parent)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr[-3000:]}"
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("refused:")]
    assert len(lines) == 4, r.stdout
    for line, want in zip(lines, ["bfloat16 or float16", "rms_group = 16",
                                  "hadamard_block = 2048", "[1, 512]"]):
        assert want in line, line
