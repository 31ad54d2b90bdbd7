"""The small-M dense GEMV for Bonsai's float projections (``in_proj_ba``) and the op that
chooses it: exact to bf16 rounding against an fp64 product (Triton interpreter on CPU, the
GPU where there is one); the op takes it where ``VLLM_PRISM_DENSE_GEMV`` picks it for the
call's M (``auto``: M <= AUTO_M) and the call fits, ``F.linear`` otherwise."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from vllm_prism.kernels.dense_gemv import AUTO_M, MAX_M, small_m_linear, small_m_problem

HERE = Path(__file__).resolve().parent
# bf16 outputs (the interpreter truncates the final conversion): about 2^-8 relative
TOL = {"bfloat16": 8e-3, "float16": 2e-3, "float32": 1e-5}


@pytest.fixture(scope="module")
def interpreter_errors(triton_interpreter) -> dict[str, float]:
    return json.loads(triton_interpreter(HERE / "dense_gemv_checks.py", timeout=600))


def test_interpreter_matches_fp64(interpreter_errors: dict[str, float]) -> None:
    assert len(interpreter_errors) == 7, interpreter_errors
    for case, err in interpreter_errors.items():
        assert err < TOL[case.split("_")[3]], (case, err)


def test_refusals_name_the_problem() -> None:
    x = torch.zeros(2, 64, dtype=torch.bfloat16)
    w = torch.zeros(8, 64, dtype=torch.bfloat16)
    if small_m_problem(x, w, None) is None:  # the interpreter is on in this process
        pytest.skip("TRITON_INTERPRET is set")
    assert "Triton" in small_m_problem(x, w, None)
    with pytest.raises(ValueError, match="small_m_linear"):
        small_m_linear(x, w)


def test_pdl_only_up_to_two_rows(monkeypatch) -> None:
    """Where PDL is available, the GEMV launches with it at M <= 2 and plainly above (it was
    slower with it from M = 4 on the H200); nowhere where PDL is not available."""
    from vllm_prism.kernels import dense_gemv

    dev = torch.device("cuda", 0)
    monkeypatch.setattr(dense_gemv, "use_pdl", lambda device: True)
    assert [dense_gemv.launches_with_pdl(m, dev) for m in (1, 2, 3, 6, 16)] == [
        True, True, False, False, False]
    monkeypatch.setattr(dense_gemv, "use_pdl", lambda device: False)
    assert not any(dense_gemv.launches_with_pdl(m, dev) for m in (1, 2, 3))


def test_the_op_uses_f_linear_unless_switched(monkeypatch) -> None:
    """``vllm_prism::dense_linear`` on CPU, every switch value: the call the GEMV cannot take
    (no Triton here) falls back to ``F.linear``, bit for bit."""
    from vllm_prism import _custom_ops

    x = torch.randn(AUTO_M, 64, dtype=torch.bfloat16)
    w = torch.randn(8, 64, dtype=torch.bfloat16)
    b = torch.randn(8, dtype=torch.bfloat16)
    for value in ("torch", "triton", "auto"):
        monkeypatch.setenv("VLLM_PRISM_DENSE_GEMV", value)
        assert torch.equal(_custom_ops.dense_linear_impl(x, w, b),
                           torch.nn.functional.linear(x, w, b))


def test_halves_op_off_the_gemv(monkeypatch) -> None:
    """``vllm_prism::dense_linear_halves`` where the GEMV cannot run (CPU): the two halves of
    ``F.linear``'s rows, each contiguous, and a zeroed buffer; its fake gives the same
    shapes."""
    from vllm_prism import _custom_ops

    monkeypatch.setenv("VLLM_PRISM_DENSE_GEMV", "auto")
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    w = torch.randn(8, 64, dtype=torch.bfloat16)
    y, zeros = _custom_ops.dense_linear_halves_impl(x, w, None, 20)
    full = torch.nn.functional.linear(x, w)
    assert y.shape == (2, 3, 4) and y[0].is_contiguous() and y[1].is_contiguous()
    assert torch.equal(y[0], full[:, :4]) and torch.equal(y[1], full[:, 4:])
    assert zeros.shape == (3, 20) and not zeros.any()
    fy, fz = _custom_ops._dense_linear_halves_fake(x, w, None, 20)
    assert fy.shape == y.shape and fz.shape == zeros.shape


def test_float_projections_keep_vllms_gemm_off_cuda() -> None:
    """On the CPU build the float projections run vLLM's own (CPU) GEMM, untouched."""
    pytest.importorskip("vllm")
    from vllm.platforms import current_platform

    from vllm_prism.model_executor.layers.quantization.prism import (PrismFloatLinearMethod,
                                                                     _dense_linear_gemm)

    if current_platform.is_cuda():
        pytest.skip("CUDA platform: see test_float_projections_run_the_op_on_cuda")
    assert PrismFloatLinearMethod()._gemm_impl is not _dense_linear_gemm


@pytest.mark.gpu
def test_float_projections_run_the_op_on_cuda(monkeypatch) -> None:
    """On CUDA the float projections call ``vllm_prism::dense_linear``; it runs the small-M
    GEMV at M <= AUTO_M under the default switch, at every M <= 16 under ``triton``, and
    ``F.linear`` otherwise (bit for bit the one or the other)."""
    pytest.importorskip("vllm")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA")
    from vllm_prism.model_executor.layers.quantization.prism import (PrismFloatLinearMethod,
                                                                     _dense_linear_gemm)

    assert PrismFloatLinearMethod()._gemm_impl is _dense_linear_gemm
    w = torch.randn(96, 5120, device="cuda").bfloat16()
    for mode, m, gemv in [(None, AUTO_M, True), (None, AUTO_M + 2, False),
                          ("torch", 1, False), ("triton", MAX_M, True)]:
        if mode is None:
            monkeypatch.delenv("VLLM_PRISM_DENSE_GEMV", raising=False)
        else:
            monkeypatch.setenv("VLLM_PRISM_DENSE_GEMV", mode)
        x = torch.randn(m, 5120, device="cuda").bfloat16()
        want = small_m_linear(x, w) if gemv else torch.nn.functional.linear(x, w)
        assert torch.equal(torch.ops.vllm_prism.dense_linear(x, w, None), want), (mode, m)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 6, MAX_M])
def test_gpu_matches_fp64(m: int) -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA")
    g = torch.Generator(device="cuda").manual_seed(m)
    x = torch.randn(m, 5120, device="cuda", generator=g).bfloat16()
    w = (torch.randn(96, 5120, device="cuda", generator=g) / 72).bfloat16()
    y = small_m_linear(x, w)
    ref = x.double() @ w.double().T
    assert ((y.double() - ref).norm() / ref.norm()).item() < 4e-3


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, AUTO_M, 6])
def test_gpu_halves_and_cleared_buffer(m: int) -> None:
    """``vllm_prism::dense_linear_halves`` on CUDA (the GEMV's launch at M <= AUTO_M,
    ``F.linear`` + copy + fill above): b and a are F.linear's two halves to bf16 rounding,
    and the core's buffer comes back zeroed although the allocator hands it memory that held
    NaNs."""
    pytest.importorskip("vllm")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA")
    from vllm_prism._custom_ops import register_ops

    register_ops()
    g = torch.Generator(device="cuda").manual_seed(m)
    x = torch.randn(m, 5120, device="cuda", generator=g).bfloat16()
    w = (torch.randn(96, 5120, device="cuda", generator=g) / 72).bfloat16()
    nans = torch.full((m, 6144), float("nan"), device="cuda", dtype=torch.bfloat16)
    del nans  # its block goes back to the allocator's cache, for the buffer below
    y, zeros = torch.ops.vllm_prism.dense_linear_halves(x, w, None, 6144)
    ref = (x.double() @ w.double().T).view(m, 2, 48).transpose(0, 1)
    assert y.shape == (2, m, 48) and y.is_contiguous()
    assert ((y.double() - ref).norm() / ref.norm()).item() < 4e-3
    assert zeros.shape == (m, 6144) and not zeros.isnan().any() and not zeros.any()
