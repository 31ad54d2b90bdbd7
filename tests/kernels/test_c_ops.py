"""The CMake-built vllm_prism._C ops against the torch reference codecs (GPU only)."""

from __future__ import annotations

import pytest
import torch

from vllm_prism import _custom_ops as ops
from vllm_prism.gguf import codecs_torch
from vllm_prism.gguf.constants import GGMLType


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 128), (7, 384), (1024, 5120)])
def test_pq2_dequantize_matches_reference(shape: tuple[int, int], dtype: torch.dtype) -> None:
    assert ops.has_compiled_ops(), "vllm_prism._C was not built: run setup.py build_ext"
    gen = torch.Generator().manual_seed(0)
    rows, k = shape
    q = torch.randint(-1, 3, (rows, k), generator=gen, dtype=torch.int8)  # includes code 3 (+2)
    d = (torch.rand(rows, k // 128, generator=gen) + 0.5).to(torch.float16)
    raw = codecs_torch.pack_blocks(q, d, GGMLType.PQ2_0)
    expected = (q.float() * d.float().repeat_interleave(128, dim=1)).to(dtype)
    got = torch.ops._C_prism.pq2_dequantize(raw.cuda(), dtype).cpu()
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
