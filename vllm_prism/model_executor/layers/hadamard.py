"""The signed block Walsh-Hadamard transform as a torch op for the model's forward pass.

The format layer's numpy/torch functions (vllm_prism.gguf.hadamard) are the reference;
these are functional (no in-place updates of views), so torch.compile can trace them, and
compute in float32. Tests check them against the reference.
"""

from __future__ import annotations

import torch


def block_hadamard(x: torch.Tensor, block: int) -> torch.Tensor:
    """Normalized Sylvester Hadamard on each contiguous ``block``-chunk of the last dim."""
    shape = x.shape
    y = x.reshape(-1, block)
    h = 1
    while h < block:
        y = y.reshape(-1, block // (2 * h), 2, h)
        a = y[:, :, 0, :]
        b = y[:, :, 1, :]
        y = torch.stack((a + b, a - b), dim=2)
        h *= 2
    return y.reshape(shape) * (block ** -0.5)


def forward_transform(x: torch.Tensor, signs: torch.Tensor, block: int) -> torch.Tensor:
    """Hblk(s ⊙ x): the input transform of a folded linear layer (float32 result)."""
    return block_hadamard(x.float() * signs, block)


def inverse_embedding_transform(z: torch.Tensor, signs: torch.Tensor, block: int
                                ) -> torch.Tensor:
    """s ⊙ Hblk(z): applied to embedding rows after the lookup (float32 result)."""
    return block_hadamard(z.float(), block) * signs
