"""When the PQ2 kernels use programmatic dependent launch: on Hopper or newer CUDA GPUs with a
Triton that supports it, unless VLLM_PRISM_PDL=0 (on by default); never the interpreter or the
CPU."""

from __future__ import annotations

import pytest
import torch

from vllm_prism.kernels import common


@pytest.fixture
def gpu(monkeypatch):
    """A pretend CUDA device of a chosen capability, with a PDL-capable Triton."""
    def make(cap: tuple[int, int]) -> torch.device:
        monkeypatch.setattr(common, "device_capability", lambda d: cap)
        monkeypatch.setattr(common, "_triton_has_pdl", lambda: True)
        monkeypatch.setattr(common, "interpreting", lambda: False)
        return torch.device("cuda", 0)
    return make


def test_on_by_default_on_hopper(gpu, monkeypatch) -> None:
    monkeypatch.delenv("VLLM_PRISM_PDL", raising=False)
    assert common.use_pdl(gpu((9, 0)))
    assert not common.use_pdl(gpu((8, 0)))


def test_on_for_hopper_and_newer(gpu, monkeypatch) -> None:
    monkeypatch.setenv("VLLM_PRISM_PDL", "1")
    assert common.use_pdl(gpu((9, 0)))
    assert common.use_pdl(gpu((10, 0)))
    assert common.pdl_launch(True) == {"launch_pdl": True}


def test_off_before_hopper(gpu, monkeypatch) -> None:
    monkeypatch.setenv("VLLM_PRISM_PDL", "1")
    assert not common.use_pdl(gpu((8, 9)))
    assert common.pdl_launch(False) == {}


@pytest.mark.parametrize("value", ["0", "off", "false"])
def test_switch_turns_it_off(gpu, monkeypatch, value: str) -> None:
    monkeypatch.setenv("VLLM_PRISM_PDL", value)
    assert not common.use_pdl(gpu((9, 0)))


def test_never_on_cpu(monkeypatch) -> None:
    monkeypatch.setenv("VLLM_PRISM_PDL", "1")
    assert not common.use_pdl(torch.device("cpu"))


def _chain_weights(k: int, widths: list[int], block: int):
    from pq2_reference import random_signs, random_ternary

    from vllm_prism.kernels.pq2.layout import PQ2Weight

    gen = torch.Generator().manual_seed(3)
    ws, kin = [], k
    for n in widths:
        raw, _, _ = random_ternary(n, kin, "PQ2_0", gen, "cuda")
        ws.append(PQ2Weight.from_raw(raw, random_signs(kin, gen, "cuda"), block))
        kin = n
    return ws


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["auto", "mma_cuda", "gemv_cuda,mma_cuda",
                                    "mma_persist_cuda,mma_cuda"])
@pytest.mark.parametrize("m", [1, 3, 16, 200])
def test_chained_linears_in_a_cuda_graph_equal_plain_launches(m: int, kernel: str,
                                                              monkeypatch) -> None:
    """Linears that feed each other (producer, weight kernel, producer, ...), captured in one
    CUDA graph with programmatic dependent launch and replayed on new inputs, give what
    ordinary launches give: a kernel that read its input before the previous kernel finished
    writing it would differ on some replay. The CUDA C++ kernels are deterministic (bit for
    bit); the Triton tensor-core kernel's K split adds with atomics in any order, so "auto"
    is held to a bf16 rounding bound instead (a stale input is off by its whole size)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from vllm_prism.kernels.pq2 import dispatch

    dev = torch.device("cuda")
    monkeypatch.setenv("VLLM_PRISM_PDL", "1")
    if not common.use_pdl(dev):
        pytest.skip("no programmatic dependent launch here (GPU before sm_90 or old Triton)")
    if kernel != "auto":
        cap = torch.cuda.get_device_capability()
        for name in kernel.split(","):
            ok, why = dispatch._BY_NAME[name].is_supported(cap)
            if not ok:
                pytest.skip(f"{name}: {why}")
        monkeypatch.setenv("VLLM_PRISM_PQ2_KERNEL", kernel)
    ws = _chain_weights(1024, [4096, 1024, 3072, 1024], block=128)

    def chain(x: torch.Tensor) -> torch.Tensor:
        for w in ws:
            x = dispatch.pq2_linear(x, w)
        return x

    gen = torch.Generator(device="cuda").manual_seed(0)
    inputs = [torch.randn(m, 1024, device=dev, generator=gen).bfloat16() for _ in range(12)]
    monkeypatch.setenv("VLLM_PRISM_PDL", "0")
    want = [chain(x) for x in inputs]
    monkeypatch.setenv("VLLM_PRISM_PDL", "1")
    static = inputs[0].clone()
    for _ in range(2):  # compile and warm up outside the capture
        chain(static)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = chain(static)
    for x, ref in zip(inputs, want):
        static.copy_(x)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.isfinite(out).all()
        _assert_same(out, ref, exact=kernel != "auto")
    for x, ref in zip(inputs, want):  # and as ordinary stream launches with PDL
        _assert_same(chain(x), ref, exact=kernel != "auto")


def _assert_same(out: torch.Tensor, ref: torch.Tensor, exact: bool) -> None:
    if exact:
        assert torch.equal(out, ref)
        return
    err = (out.float() - ref.float()).abs().max().item()
    scale = ref.float().abs().max().item()
    assert err <= 2e-2 * scale, f"max |diff| {err:.4g} against max |ref| {scale:.4g}"
