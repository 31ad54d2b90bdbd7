"""The prefill GEMMs on Hopper's warpgroup MMA (``wgmma_cuda``, csrc/pq2/wgmma_prefill.cu,
and ``wgmma_fold``, csrc/pq2/wgmma_fold.cuh).

On the GPU (compute capability 9.0, vllm_prism._C built with sm_90a): against the fp64
reference of codecs_torch + gguf.hadamard (wgmma_cuda, the int8 activation's rounding: under
1.5e-2; wgmma_fold, with its folded weight scales on the test's scales spread over 3x: under
3e-2), and against the integer reference of the same int8 activation and (wgmma_fold) the
same folded scales, written out from their rules in pq2_reference.py (under 4e-3: the 16-bit
output's rounding), for partial row, token and 1024-block tiles, bias, bf16 and fp16;
wgmma_fold folds at 63 levels where the codes hold a 3 and at 127 where they are ternary. Off the
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
    # wgmma_fold: ternary codes from M = 512 with VLLM_PRISM_PQ2_FOLD_PREFILL=1 (test_pq2_layout)
    assert kernel.in_auto == (kernel is FOLD)
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


def _fold_references(act, q, d, bias, levels: int):
    """The folded integer reference of the same int8 activation at ``levels``."""
    xq, sxb = quantize_q8_blocks(act.data, 1024)
    sx = sxb.repeat_interleave(8, dim=1)[:, :d.shape[1]]
    return integer_reference(xq, sx, q, fold_scales(d, levels=levels), bias)


@prefill_cases
def test_wgmma_fold_prefill(case, m: int, dtype: torch.dtype) -> None:
    """Codes 0..3 (code 3 present): the scales fold at 63 levels."""
    (_, q, d, _, w), act, bias, y, ref = run_case(FOLD, case, m, dtype)
    assert not w.is_ternary()
    err = rel_err(y, ref)
    assert err < 3e-2, f"relative error {err:.2e} against the exact product"
    err = rel_err(y, _fold_references(act, q, d, bias, 63))
    assert err < 4e-3, f"relative error {err:.2e} against the folded integer reference"


@prefill_cases
def test_wgmma_fold_prefill_ternary(case, m: int, dtype: torch.dtype) -> None:
    """Codes 0..2 only (a ternary checkpoint's, recorded when the planes were prepared): the
    scales fold at 127 levels, so the result is the 127-level reference's and nearer the
    exact product than the 63-level rule allows."""
    (_, q, d, _, w), act, bias, y, ref = run_case(FOLD, case, m, dtype, code3=False)
    assert w.is_ternary()
    err127 = rel_err(y, _fold_references(act, q, d, bias, 127))
    err63 = rel_err(y, _fold_references(act, q, d, bias, 63))
    assert err127 < 4e-3, f"relative error {err127:.2e} against the 127-level reference"
    assert err127 < err63 / 2, (err127, err63)
    assert rel_err(y, ref) < 3e-2


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", [KERNEL, FOLD], ids=lambda k: k.name)
def test_named_kernel_runs(kernel, monkeypatch) -> None:
    check_named_kernel(kernel, monkeypatch)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", [KERNEL, FOLD], ids=lambda k: k.name)
def test_op_rejects_bad_input(kernel) -> None:
    need_kernel(kernel)
    levels = (63,) if kernel is FOLD else ()

    def op(*args):
        return getattr(torch.ops._C_prism, kernel.op)(*args, *levels)

    *_, w = random_case(256, 1024, None)
    x = torch.randn(256, 1024, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match=f"{kernel.op}.*K = 512"):
        op(w.codes, w.scales, x[:, :512].contiguous(), torch.bfloat16)
    with pytest.raises(RuntimeError, match="bf16 or fp16"):
        op(w.codes, w.scales, x.float(), torch.bfloat16)
    if kernel is FOLD:
        with pytest.raises(RuntimeError, match="levels must be 63"):
            torch.ops._C_prism.pq2_wgmma_fold_prefill(w.codes, w.scales, x, torch.bfloat16, 64)
