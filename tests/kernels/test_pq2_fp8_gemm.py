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

from pq2_reference import rel_err
from prefill_kernel_helpers import check_named_kernel, prefill_cases, prefill_config, run_case

from vllm_prism.kernels.pq2 import dispatch

KERNEL = dispatch.GemmFp8Kernel
_config = prefill_config


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


@prefill_cases
def test_gemm_fp8(case, m: int, dtype: torch.dtype) -> None:
    from vllm_prism.kernels.pq2.triton_fp8 import pq2_codes_fp8, quantize_fp8_1x128

    (_, _, _, _, w), act, bias, y, ref = run_case(KERNEL, case, m, dtype)
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
    check_named_kernel(KERNEL, monkeypatch)
