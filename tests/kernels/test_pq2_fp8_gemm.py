"""The FP8 prefill GEMM (``gemm_fp8``, vllm_prism/kernels/pq2/triton_fp8.py).

On the GPU (sm_90): against the fp64 reference of codecs_torch + gguf.hadamard (the e4m3
activation's rounding: under 4e-2, and above the bf16 kernels' error, so the FP8 path did
run), against an fp32 emulation of the same quantized operands (cuBLAS's 1x128 block scaling
applied as documented: under 2e-3, the bf16 output's rounding and the tensor cores'
accumulation), and the activation's e4m3 values against torch's round-to-nearest conversion.
Off the GPU: where the dispatch refuses it. Its two Triton passes are checked under the
interpreter (pq2_interpreter_checks.py ``fp8-operands``).
"""

from __future__ import annotations

import pytest
import torch

from pq2_reference import random_signs, random_ternary, reference_linear, rel_err

from vllm_prism.kernels.pq2 import dispatch
from vllm_prism.kernels.pq2.layout import PQ2Weight

KERNEL = dispatch.GemmFp8Kernel


def _config(m: int, n: int = 256, k: int = 1024, dtype=torch.bfloat16,
            capability=(9, 0)) -> dispatch.PQ2LinearConfig:
    return dispatch.PQ2LinearConfig(m=m, n=n, k=k, dtype=dtype, fmt="PQ2_0",
                                    device_type="cuda", capability=capability)


def test_refusals() -> None:
    ok, why = KERNEL.is_supported((8, 9))
    assert not ok and "sm_90" in why
    ok, why = KERNEL.is_supported(None)
    assert not ok
    assert "prefill" in KERNEL.can_implement(_config(64))[1]
    assert "multiple of 16" in KERNEL.can_implement(_config(512, n=300))[1]
    assert "bf16 or fp16" in KERNEL.can_implement(_config(512, dtype=torch.float32))[1]
    assert "LM head" in KERNEL.can_implement(_config(512, n=248320, k=5120))[1]
    assert KERNEL.can_implement(_config(512, n=34816, k=5120)) == (True, "")
    assert KERNEL.can_implement(_config(512)) == (True, "")
    assert not KERNEL.in_auto


def _need_sm90() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    ok, why = KERNEL.is_supported(torch.cuda.get_device_capability())
    if not ok:
        pytest.skip(why)


def _case(n: int, k: int, block: int | None):
    gen = torch.Generator().manual_seed(n + k)
    raw, q, d = random_ternary(n, k, "PQ2_0", gen, "cuda")
    signs = random_signs(k, gen, "cuda") if block else None
    return raw, signs, PQ2Weight.from_raw(raw, signs, block)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [128, 136, 513])
@pytest.mark.parametrize("case", [(12288, 5120, 1024), (5120, 17408, 1024), (304, 2304, 256),
                                  (96, 384, None)], ids=lambda c: f"{c[0]}x{c[1]}-b{c[2]}")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gemm_fp8(case, m: int, dtype: torch.dtype) -> None:
    from vllm_prism.kernels.pq2.triton_fp8 import pq2_codes_fp8, quantize_fp8_1x128

    _need_sm90()
    n, k, block = case
    raw, signs, w = _case(n, k, block)
    x = torch.randn(m, k, device="cuda", generator=torch.Generator("cuda").manual_seed(m))
    x = x.to(dtype)
    bias = torch.randn(n, device="cuda", dtype=dtype) if n == 304 else None
    assert KERNEL.can_implement(dispatch.PQ2LinearConfig.of(m, w, dtype)) == (True, "")
    act = KERNEL.make_activation(x, w)
    y = KERNEL.run(act, w, bias, dtype)
    assert y.shape == (m, n) and y.dtype == dtype and torch.isfinite(y).all()
    ref = reference_linear(x, raw, "PQ2_0", signs, block, bias)
    err = rel_err(y, ref)
    assert 4e-3 < err < 4e-2, f"relative error {err:.2e} (bf16 paths: ~2e-3)"
    # the activation rounds to nearest, as torch's conversion of x / scale
    xq, xs = quantize_fp8_1x128(act.data)
    assert xq.shape[0] == m and xs.shape[0] == m
    want = (act.data.float().view(m, -1, 128) / xs[..., None]).to(torch.float8_e4m3fn)
    same = xq.view(m, -1, 128).view(torch.uint8) == want.view(torch.uint8)
    assert same.float().mean() > 0.999, f"{(~same).sum()} e4m3 values differ from torch's"
    # the same quantized operands multiplied in fp32: what cuBLAS's block scaling computes
    wq, ws = pq2_codes_fp8(w)
    xe = xq.float() * xs.repeat_interleave(128, 1)
    we = wq.float() * ws.t().repeat_interleave(128, 1)
    emu = xe @ we.t() + (bias.float() if bias is not None else 0)
    y32 = KERNEL.run(act, w, bias, torch.float32)
    assert rel_err(y32, emu) < 2e-3


@pytest.mark.gpu
def test_named_kernel_runs(monkeypatch) -> None:
    _need_sm90()
    _, _, w = _case(256, 1024, None)
    monkeypatch.setenv("VLLM_PRISM_PQ2_KERNEL", "gemm_fp8,auto")
    dispatch._select.cache_clear()
    try:
        assert dispatch.select_kernel(512, w, torch.bfloat16).name == "gemm_fp8"
        assert dispatch.select_kernel(64, w, torch.bfloat16).name != "gemm_fp8"
    finally:
        dispatch._select.cache_clear()
