"""The serving path's one torch Hadamard (kernels/pq2/hadamard.py) against the format layer's
reference (vllm_prism.gguf.hadamard, numpy, float64), any leading shape."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vllm_prism.gguf import hadamard as ref
from vllm_prism.kernels.pq2.hadamard import (block_hadamard_torch,
                                             inverse_signed_hadamard_torch,
                                             signed_hadamard_torch)


@pytest.mark.parametrize("block", [1, 2, 16, 128, 256])
@pytest.mark.parametrize("shape", [(5, 512), (2, 3, 256), (0, 256)])
def test_matches_reference(block: int, shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(block + len(shape))
    x = rng.standard_normal(shape)
    signs = rng.choice([-1.0, 1.0], size=shape[-1])
    xt = torch.from_numpy(x).float()
    st = torch.from_numpy(signs).float()
    np.testing.assert_allclose(block_hadamard_torch(xt, block).numpy(),
                               ref.block_hadamard(x, block), atol=2e-5)
    np.testing.assert_allclose(signed_hadamard_torch(xt, st, block).numpy(),
                               ref.forward_transform(x, signs, block), atol=2e-5)
    np.testing.assert_allclose(inverse_signed_hadamard_torch(xt, st, block).numpy(),
                               ref.inverse_embedding_transform(x, signs, block), atol=2e-5)


def test_functional_under_compile() -> None:
    """No in-place update of a view: Dynamo traces it with a dynamic leading dimension."""
    x = torch.randn(64, 256)
    torch._dynamo.mark_dynamic(x, 0)
    fn = torch.compile(block_hadamard_torch, fullgraph=True, backend="eager")
    torch.testing.assert_close(fn(x, 128), block_hadamard_torch(x, 128), rtol=0, atol=0)
