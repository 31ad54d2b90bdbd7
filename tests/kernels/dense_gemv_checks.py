"""The small-M dense GEMV (vllm_prism.kernels.dense_gemv) under the Triton CPU interpreter.

Started by test_dense_gemv.py in a subprocess with TRITON_INTERPRET=1. Prints one JSON object:
case -> relative L2 error against an fp64 torch product of the same inputs.
"""

from __future__ import annotations

import json
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

from vllm_prism.kernels.dense_gemv import small_m_linear  # noqa: E402

# (M, N, K, dtype, bias): the 27B in_proj_ba width at M = 1 / 6 / 16, a K that is not a
# multiple of the 2048-wide chunks, an odd N, fp32
CASES = [(1, 96, 5120, torch.bfloat16, False), (6, 96, 5120, torch.bfloat16, True),
         (16, 33, 1000, torch.bfloat16, True), (3, 17, 4200, torch.float32, True),
         (1, 5, 64, torch.float16, False)]


def run() -> dict[str, float]:
    g = torch.Generator().manual_seed(0)
    out = {}
    for m, n, k, dtype, has_bias in CASES:
        x = torch.randn(m, k, generator=g).to(dtype)
        w = (torch.randn(n, k, generator=g) / k ** 0.5).to(dtype)
        b = torch.randn(n, generator=g).to(dtype) if has_bias else None
        y = small_m_linear(x, w, b)
        ref = x.double() @ w.double().T + (b.double() if has_bias else 0.0)
        assert y.shape == (m, n) and y.dtype == dtype
        err = ((y.double() - ref).norm() / ref.norm()).item()
        out[f"m{m}_n{n}_k{k}_{str(dtype).split('.')[-1]}{'_bias' if has_bias else ''}"] = err
    # halves (in_proj_ba's b and a, each contiguous) and a buffer cleared in the same launch
    # (the Gated DeltaNet core's output): a NaN-filled buffer must come back all zeros
    for m, n, k, numel in ((1, 96, 5120, 6144), (2, 10, 300, 7)):
        x = torch.randn(m, k, generator=g).to(torch.bfloat16)
        w = (torch.randn(n, k, generator=g) / k ** 0.5).to(torch.bfloat16)
        clear = torch.full((numel,), float("nan"), dtype=torch.bfloat16)
        y = small_m_linear(x, w, halves=True, clear=clear)
        ref = (x.double() @ w.double().T).view(m, 2, n // 2).transpose(0, 1)
        assert y.shape == (2, m, n // 2) and y.is_contiguous()
        assert torch.equal(clear, torch.zeros_like(clear)), "clear"
        err = ((y.double() - ref).norm() / ref.norm()).item()
        out[f"m{m}_n{n}_k{k}_bfloat16_halves"] = err
    return out


if __name__ == "__main__":
    print(json.dumps(run()))
