"""Python face of the compiled ops in vllm_prism._C, with the torch path where they are absent.

The extension is optional: a CPU install, or a CUDA install built without a toolkit, has no
``vllm_prism._C``; callers use the functions here and get the compiled op on CUDA tensors
when it exists and the exact torch reference otherwise.
"""

from __future__ import annotations

import functools
import importlib
import logging

import torch

from vllm_prism.gguf.codecs_torch import dequantize_to
from vllm_prism.gguf.constants import GGMLType

logger = logging.getLogger(__name__)


@functools.cache
def has_compiled_ops() -> bool:
    """Whether vllm_prism._C was built and loads in this process."""
    try:
        importlib.import_module("vllm_prism._C")
    except ImportError as e:
        logger.debug("vllm_prism._C is not available (%s); using the Triton/torch paths", e)
        return False
    return hasattr(torch.ops, "_C_prism") and hasattr(torch.ops._C_prism, "pq2_dequantize")


def pq2_dequantize(raw: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """Dense [rows, K] weights from packed PQ2_0 rows (uint8 [rows, K/128*34])."""
    if raw.is_cuda and has_compiled_ops():
        return torch.ops._C_prism.pq2_dequantize(raw.contiguous(), dtype)
    return dequantize_to(raw, GGMLType.PQ2_0, dtype)
