"""The prefill GEMM on Hopper's warpgroup MMA (``wgmma_cuda``, csrc/pq2/wgmma_prefill.cu).

On the GPU (compute capability 9.0, vllm_prism._C built with sm_90a): against the fp64
reference of codecs_torch + gguf.hadamard (the int8 activation's rounding: under 1.5e-2), and
against the integer reference of the same int8 activation written out from its rule in
pq2_reference.py (under 4e-3: the 16-bit output's rounding), for partial row and token tiles,
bias, bf16 and fp16. Off the GPU: where the dispatch refuses it. Its build (no spills, no
serialized MMAs) is checked in test_csrc_compile.py.
"""

from __future__ import annotations

import pytest
import torch

from pq2_reference import integer_reference, quantize_q8, rel_err
from prefill_kernel_helpers import (check_named_kernel, need_kernel, prefill_cases,
                                    prefill_config, random_case, run_case)

from vllm_prism.kernels.pq2 import dispatch

KERNEL = dispatch.WgmmaCudaKernel


def test_refusals() -> None:
    ok, why = KERNEL.is_supported((8, 9))
    assert not ok and "9.0" in why
    ok, why = KERNEL.is_supported((10, 0))
    assert not ok and "9.0" in why
    assert not KERNEL.is_supported(None)[0]
    assert "prefill" in KERNEL.can_implement(prefill_config(64))[1]
    assert "bf16 or fp16" in KERNEL.can_implement(prefill_config(512, dtype=torch.float32))[1]
    assert "multiple of 128" in KERNEL.can_implement(prefill_config(512, k=1088))[1]
    assert KERNEL.can_implement(prefill_config(512, n=248320, k=5120)) == (True, "")
    assert not KERNEL.in_auto
    assert dispatch._BY_NAME["wgmma_cuda"] is KERNEL


@prefill_cases
def test_wgmma_prefill(case, m: int, dtype: torch.dtype) -> None:
    (_, q, d, _, _), act, bias, y, ref = run_case(KERNEL, case, m, dtype)
    err = rel_err(y, ref)
    assert err < 1.5e-2, f"relative error {err:.2e} against the exact product"
    xq, sx = quantize_q8(act.data)
    exact = integer_reference(xq, sx, q, d, bias)
    err = rel_err(y, exact)
    assert err < 4e-3, f"relative error {err:.2e} against the same int8 activation"


@pytest.mark.gpu
def test_named_kernel_runs(monkeypatch) -> None:
    check_named_kernel(KERNEL, monkeypatch)


@pytest.mark.gpu
def test_op_rejects_bad_input() -> None:
    need_kernel(KERNEL)
    *_, w = random_case(256, 1024, None)
    x = torch.randn(256, 1024, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="K = 512"):
        torch.ops._C_prism.pq2_wgmma_prefill(w.codes, w.scales, x[:, :512].contiguous(),
                                             torch.bfloat16)
    with pytest.raises(RuntimeError, match="bf16 or fp16"):
        torch.ops._C_prism.pq2_wgmma_prefill(w.codes, w.scales, x.float(), torch.bfloat16)
