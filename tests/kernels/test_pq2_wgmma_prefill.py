"""The prefill GEMMs on Hopper's warpgroup MMA (``wgmma_cuda``, csrc/pq2/wgmma_prefill.cu,
and ``wgmma_fold``, csrc/pq2/wgmma_fold.cuh).

On the GPU (compute capability 9.0, vllm_prism._C built with sm_90a): against the fp64
reference of codecs_torch + gguf.hadamard (wgmma_cuda, the int8 activation's rounding: under
1.5e-2; wgmma_fold, with its folded weight scales on the test's scales spread over 3x: under
3e-2), and against the integer reference of the same int8 activation and (wgmma_fold) the
same folded scales, written out from their rules in pq2_reference.py (under 4e-3: the 16-bit
output's rounding), for partial row, token and 1024-block tiles, bias, bf16 and fp16. Off the
GPU: where the dispatch refuses them. Their build (no spills, no serialized MMAs) is checked in
test_csrc_compile.py.
"""

from __future__ import annotations

import pytest
import torch

from pq2_reference import (fold_scales, integer_reference, quantize_q8, quantize_q8_blocks,
                           rel_err)
from prefill_kernel_helpers import (check_named_kernel, need_kernel, prefill_cases,
                                    prefill_config, random_case, run_case)

from vllm_prism.kernels.pq2 import dispatch

KERNEL = dispatch.WgmmaCudaKernel
FOLD = dispatch.WgmmaFoldKernel


@pytest.mark.parametrize("kernel", [KERNEL, FOLD], ids=lambda k: k.name)
def test_refusals(kernel) -> None:
    ok, why = kernel.is_supported((8, 9))
    assert not ok and "9.0" in why
    ok, why = kernel.is_supported((10, 0))
    assert not ok and "9.0" in why
    assert not kernel.is_supported(None)[0]
    assert "prefill" in kernel.can_implement(prefill_config(64))[1]
    assert "bf16 or fp16" in kernel.can_implement(prefill_config(512, dtype=torch.float32))[1]
    assert "multiple of 128" in kernel.can_implement(prefill_config(512, k=1088))[1]
    assert kernel.can_implement(prefill_config(512, n=248320, k=5120)) == (True, "")
    assert not kernel.in_auto
    assert dispatch._BY_NAME[kernel.name] is kernel


@prefill_cases
def test_wgmma_prefill(case, m: int, dtype: torch.dtype) -> None:
    (_, q, d, _, _), act, bias, y, ref = run_case(KERNEL, case, m, dtype)
    err = rel_err(y, ref)
    assert err < 1.5e-2, f"relative error {err:.2e} against the exact product"
    xq, sx = quantize_q8(act.data)
    exact = integer_reference(xq, sx, q, d, bias)
    err = rel_err(y, exact)
    assert err < 4e-3, f"relative error {err:.2e} against the same int8 activation"


@prefill_cases
def test_wgmma_fold_prefill(case, m: int, dtype: torch.dtype) -> None:
    (_, q, d, _, _), act, bias, y, ref = run_case(FOLD, case, m, dtype)
    err = rel_err(y, ref)
    assert err < 3e-2, f"relative error {err:.2e} against the exact product"
    xq, sxb = quantize_q8_blocks(act.data, 1024)
    groups = d.shape[1]
    sx = sxb.repeat_interleave(8, dim=1)[:, :groups]
    exact = integer_reference(xq, sx, q, fold_scales(d), bias)
    err = rel_err(y, exact)
    assert err < 4e-3, f"relative error {err:.2e} against the folded integer reference"


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", [KERNEL, FOLD], ids=lambda k: k.name)
def test_named_kernel_runs(kernel, monkeypatch) -> None:
    check_named_kernel(kernel, monkeypatch)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", [KERNEL, FOLD], ids=lambda k: k.name)
def test_op_rejects_bad_input(kernel) -> None:
    need_kernel(kernel)
    op = getattr(torch.ops._C_prism, kernel.op)
    *_, w = random_case(256, 1024, None)
    x = torch.randn(256, 1024, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match=f"{kernel.op}.*K = 512"):
        op(w.codes, w.scales, x[:, :512].contiguous(), torch.bfloat16)
    with pytest.raises(RuntimeError, match="bf16 or fp16"):
        op(w.codes, w.scales, x.float(), torch.bfloat16)
