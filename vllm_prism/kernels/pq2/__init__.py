"""Ternary (PQ2_0 / PTQ1_0) linear layers with the folded Hadamard rotation.

Public API::

    w = PQ2Weight.from_raw(raw_uint8_rows, signs=None, hadamard_block=None)   # once, after loading
    y = pq2_linear(x, w, bias=None)          # y = W_st @ Hblk(signs * x) + bias, x [..., K]
    h = hadamard_transform(x, signs, block)  # standalone signed block Hadamard (Triton)

See dispatch.py for the kernel choice and VLLM_PRISM_PQ2_KERNEL.
"""

from vllm_prism.kernels.pq2.dispatch import (KERNELS, pq2_linear, pq2_linear_from_activation,
                                             select_kernel)
from vllm_prism.kernels.pq2.hadamard import (ActKind, PQ2Activation, hadamard_transform,
                                             transform_activation)
from vllm_prism.kernels.pq2.layout import PQ2Weight, PTQ1Weight

__all__ = ["KERNELS", "ActKind", "PQ2Activation", "PQ2Weight", "PTQ1Weight", "hadamard_transform",
           "pq2_linear", "pq2_linear_from_activation", "select_kernel", "transform_activation"]
