"""What the tests of the opt-in prefill kernels share (``gemm_fp8``, ``wgmma_cuda``): the
config of a PQ2 prefill call, the skip where a kernel cannot run here, a random weight with
its planes, and the check that ``VLLM_PRISM_PQ2_KERNEL`` selects a named kernel for prefill
only."""

from __future__ import annotations

import pytest
import torch

from pq2_reference import random_signs, random_ternary, reference_linear

from vllm_prism.kernels.pq2 import dispatch
from vllm_prism.kernels.pq2.layout import PQ2Weight


def prefill_config(m: int, n: int = 256, k: int = 1024, dtype=torch.bfloat16,
                   capability=(9, 0)) -> dispatch.PQ2LinearConfig:
    return dispatch.PQ2LinearConfig(m=m, n=n, k=k, dtype=dtype, fmt="PQ2_0",
                                    device_type="cuda", capability=capability)


def need_kernel(kernel: type[dispatch.PQ2LinearKernel]) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    ok, why = kernel.is_supported(torch.cuda.get_device_capability())
    if not ok:
        pytest.skip(why)


def random_case(n: int, k: int, block: int | None, code3: bool = True):
    """(raw, q, d, signs, PQ2Weight) on the GPU; signs and the rotation where ``block``; codes
    0..3, or 0..2 without ``code3`` (a ternary checkpoint's)."""
    gen = torch.Generator().manual_seed(n + k)
    raw, q, d = random_ternary(n, k, "PQ2_0", gen, "cuda", code3=code3)
    signs = random_signs(k, gen, "cuda") if block else None
    return raw, q, d, signs, PQ2Weight.from_raw(raw, signs, block)


# (N, K, Hadamard block or None): two 27B projections, a bias with partial row tiles, a matrix
# smaller than one row tile without rotation; M: one tile, a partial tile, past 512.
PREFILL_CASES = [(12288, 5120, 1024), (5120, 17408, 1024), (304, 2304, 256), (96, 384, None)]
PREFILL_MS = [128, 136, 513]


def case_id(case) -> str:
    return f"{case[0]}x{case[1]}-b{case[2]}"


def prefill_cases(fn):
    """A GPU test over M in PREFILL_MS, PREFILL_CASES and bf16 / fp16 (args m, case, dtype)."""
    for mark in (pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16]),
                 pytest.mark.parametrize("case", PREFILL_CASES, ids=case_id),
                 pytest.mark.parametrize("m", PREFILL_MS), pytest.mark.gpu):
        fn = mark(fn)
    return fn


def run_case(kernel: type[dispatch.PQ2LinearKernel], case, m: int, dtype: torch.dtype,
             code3: bool = True):
    """The kernel on a random case (a bias where N = 304; codes 0..2 only without ``code3``):
    checks the selection, the shape, dtype and finiteness, and returns (planes (raw, q, d,
    signs, w), activation, y, fp64 reference)."""
    need_kernel(kernel)
    n, k, block = case
    raw, q, d, signs, w = random_case(n, k, block, code3)
    x = torch.randn(m, k, device="cuda", generator=torch.Generator("cuda").manual_seed(m))
    x = x.to(dtype)
    bias = torch.randn(n, device="cuda", dtype=dtype) if n == 304 else None
    assert kernel.can_implement(dispatch.PQ2LinearConfig.of(m, w, dtype)) == (True, "")
    act = kernel.make_activation(x, w)
    y = kernel.run(act, w, bias, dtype)
    assert y.shape == (m, n) and y.dtype == dtype and torch.isfinite(y).all()
    ref = reference_linear(x, raw, "PQ2_0", signs, block, bias)
    return (raw, q, d, signs, w), act, bias, y, ref


def check_named_kernel(kernel: type[dispatch.PQ2LinearKernel], monkeypatch) -> None:
    """Named first, the kernel takes a 512-row call and leaves a 64-row one to auto."""
    need_kernel(kernel)
    *_, w = random_case(256, 1024, None)
    monkeypatch.setenv("VLLM_PRISM_PQ2_KERNEL", f"{kernel.name},auto")
    dispatch._select.cache_clear()
    try:
        assert dispatch.select_kernel(512, w, torch.bfloat16).name == kernel.name
        assert dispatch.select_kernel(64, w, torch.bfloat16).name != kernel.name
    finally:
        dispatch._select.cache_clear()
