"""A Triton GEMV for the float (unquantized) projections Bonsai keeps, at decode sizes.

Bonsai files keep the Gated DeltaNet's ``in_proj_ba`` (``[2 x 48, 5120]`` for the 27B model)
in bf16. At batch 1 vLLM runs it through cuBLAS, which picks a split-K GEMM and a separate
reduction kernel for the skinny output: two launches, 4.9 + 1.5 us a layer on the H200
(benchmarks/results/e2e_h200_notes.md, eleventh run), 0.3 ms of a 5.3 ms step over 48 layers.

:func:`small_m_linear` is ``x @ w.T + bias`` for ``M <= MAX_M`` rows in one launch: one
program per ``BLOCK_N`` output rows walks K in ``BLOCK_K`` chunks, the next chunk of weights
loaded before the current one is reduced (fp32 accumulation, products summed per chunk in
registers). With programmatic dependent launch (up to ``PDL_MAX_M`` rows: slower above) the
first weight chunk is requested before the grid-dependency wait: the weights do not depend on
the kernel before.

The op choosing it (``vllm_prism::dense_linear``, :mod:`vllm_prism._custom_ops`) runs it
where ``VLLM_PRISM_DENSE_GEMV`` picks it for the call's M (``auto``, the default: M <=
``AUTO_M``) and :func:`small_m_problem` finds nothing against it; ``F.linear`` otherwise.
On the H200 (benchmarks/results/dense_gemv_h200.md) it takes 3.2 / 2.7 us at M = 1 / 2
against cuBLAS's 6.3, 5.6 against 6.4 us at M = 6 and 8 (launched without PDL: with it 7.2
at M = 4, slower than cuBLAS), and loses at M = 16 (8.2 against 6.5 us: one program per
output row re-reads the activation rows). Through vLLM, a 6-token verification step of the
27B model: 282 us a step against 435 us for cuBLAS's GEMM, its split-K reduction and the two
launches ``halves`` and ``clear`` spare (benchmarks/results/e2e_h200_notes.md, eighteenth
session).

Two options serve vLLM's Gated DeltaNet, which splits ``in_proj_ba``'s output into ``b`` and
``a``, copies each to a contiguous tensor and zero-fills its core's output buffer, three
launches of their own: ``halves`` writes the output as ``[2, M, N/2]`` (the two halves, each
contiguous), and ``clear`` zero-fills a tensor in the same launch.
"""

from __future__ import annotations

import torch

from vllm_prism.kernels.common import (HAS_TRITON, cdiv, next_power_of_2, pdl_launch,
                                       triton_can_run, use_pdl)

if HAS_TRITON:
    import triton
    import triton.language as tl

__all__ = ["AUTO_M", "MAX_M", "MAX_N", "PDL_MAX_M", "launches_with_pdl", "small_m_linear",
           "small_m_problem"]

MAX_M = 16  # rows of x a call takes (decode, small batches, speculative verification)
AUTO_M = 8  # rows up to which the default (VLLM_PRISM_DENSE_GEMV=auto) takes it
# rows up to which it launches with programmatic dependent launch (where use_pdl allows):
# from M = 4 it was slower with it on the H200 (M = 6: 8.29 against 5.57 us; F.linear 6.37;
# benchmarks/results/dense_gemv_h200.md), so VLLM_PRISM_DENSE_GEMV=triton launches it
# plainly there
PDL_MAX_M = 2
MAX_N = 1024  # output rows: the skinny projections this is for
BLOCK_K = 2048
DTYPES = (torch.bfloat16, torch.float16, torch.float32)

if HAS_TRITON:

    @triton.jit
    def _small_m_gemv_kernel(x_ptr, w_ptr, b_ptr, y_ptr, z_ptr, M, N, K, N_PART, Z_NUMEL,
                             stride_xm, stride_wn, stride_ym, stride_yp,
                             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                             BLOCK_K: tl.constexpr, HAS_BIAS: tl.constexpr,
                             CLEAR_BLOCK: tl.constexpr, PDL: tl.constexpr):
        if PDL:
            tl.extra.cuda.gdc_launch_dependents()
        rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        row_ok = rows < N
        ms = tl.arange(0, BLOCK_M)
        m_ok = ms < M
        ks = tl.arange(0, BLOCK_K)
        w_rows = w_ptr + rows.to(tl.int64)[:, None] * stride_wn
        w = tl.load(w_rows + ks[None, :], mask=row_ok[:, None] & (ks[None, :] < K), other=0.0)
        if PDL:
            tl.extra.cuda.gdc_wait()  # x is complete, and the output ours to write, past here
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            kn = k0 + BLOCK_K + ks
            w_next = tl.load(w_rows + kn[None, :], mask=row_ok[:, None] & (kn[None, :] < K),
                             other=0.0)
            kc = k0 + ks
            x = tl.load(x_ptr + ms.to(tl.int64)[:, None] * stride_xm + kc[None, :],
                        mask=m_ok[:, None] & (kc[None, :] < K), other=0.0)
            prod = x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :]
            acc += tl.sum(prod, axis=2)
            w = w_next
        if HAS_BIAS:
            acc += tl.load(b_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)[None, :]
        part = rows // N_PART  # output row r goes to part r // N_PART, column r % N_PART
        y_cols = part.to(tl.int64) * stride_yp + (rows - part * N_PART)
        y = y_ptr + ms.to(tl.int64)[:, None] * stride_ym + y_cols[None, :]
        tl.store(y, acc.to(y_ptr.dtype.element_ty), mask=m_ok[:, None] & row_ok[None, :])
        if CLEAR_BLOCK > 0:  # past the wait: the buffer may be memory the kernel before freed
            zs = tl.arange(0, CLEAR_BLOCK)
            step = tl.num_programs(0) * CLEAR_BLOCK
            for z0 in range(tl.program_id(0) * CLEAR_BLOCK, Z_NUMEL, step):
                tl.store(z_ptr + z0 + zs, tl.zeros([CLEAR_BLOCK], z_ptr.dtype.element_ty),
                         mask=z0 + zs < Z_NUMEL)


def small_m_problem(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> str | None:
    """Why :func:`small_m_linear` cannot take ``x [M, K] @ w [N, K].T``, or None."""
    if not triton_can_run(x.device):
        return "Triton cannot run on this device"
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[1]:
        return f"shapes {tuple(x.shape)} x {tuple(w.shape)}"
    if not 1 <= x.shape[0] <= MAX_M:
        return f"M = {x.shape[0]} is outside 1..{MAX_M}"
    if w.shape[0] > MAX_N:
        return f"N = {w.shape[0]} > {MAX_N}"
    if x.dtype not in DTYPES or w.dtype != x.dtype:
        return f"dtypes {x.dtype} x {w.dtype}"
    if x.stride(1) != 1 or w.stride(1) != 1:
        return "x and w need unit column strides"
    if bias is not None and (bias.shape != (w.shape[0],) or bias.stride(0) != 1):
        return f"bias of shape {tuple(bias.shape)}"
    return None


def launches_with_pdl(m: int, device: torch.device) -> bool:
    """Whether :func:`small_m_linear` launches an M-row call with programmatic dependent
    launch by default: where :func:`use_pdl` allows it, up to PDL_MAX_M rows."""
    return m <= PDL_MAX_M and use_pdl(device)


def small_m_linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None, *,
                   halves: bool = False, clear: torch.Tensor | None = None,
                   pdl: bool | None = None) -> torch.Tensor:
    """``x @ w.T + bias`` for x ``[M <= MAX_M, K]`` and w ``[N <= MAX_N, K]`` of one dtype, in
    one Triton launch; the output has x's dtype, shape ``[M, N]``, or ``[2, M, N/2]`` (the
    two halves of every row) with ``halves``. ``clear``, a contiguous tensor, is zero-filled
    by the same launch. ``pdl`` overrides :func:`launches_with_pdl` (the benchmark times
    both). ValueError where :func:`small_m_problem` says it cannot."""
    why = small_m_problem(x, w, bias)
    if why is None and halves and w.shape[0] % 2:
        why = f"halves of an odd N = {w.shape[0]}"
    if why is None and clear is not None and (not clear.is_contiguous()
                                              or clear.device != x.device):
        why = "the tensor to clear must be contiguous, on x's device"
    if why is not None:
        raise ValueError(f"small_m_linear: {why}")
    m, k = x.shape
    n = w.shape[0]
    n_part = n // 2 if halves else n
    y = torch.empty((2, m, n_part) if halves else (m, n), dtype=x.dtype, device=x.device)
    block_m = max(1, next_power_of_2(m))
    block_n = 1  # one program per output row: 96 programs for the 27B model's in_proj_ba
    grid = cdiv(n, block_n)
    z_numel = clear.numel() if clear is not None else 0
    clear_block = min(1024, next_power_of_2(cdiv(z_numel, grid))) if z_numel else 0
    pdl = launches_with_pdl(m, x.device) if pdl is None else pdl and use_pdl(x.device)
    _small_m_gemv_kernel[(grid,)](
        x, w, bias if bias is not None else w, y, clear if clear is not None else y, m, n, k,
        n_part, z_numel, x.stride(0), w.stride(0), y.stride(-2), y.stride(0) if halves else 0,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=min(BLOCK_K, next_power_of_2(k)),
        HAS_BIAS=bias is not None, CLEAR_BLOCK=clear_block, PDL=pdl,
        num_warps=8 if block_m > 4 else 4, **pdl_launch(pdl))
    return y
