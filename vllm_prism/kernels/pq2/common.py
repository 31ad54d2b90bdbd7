"""Small helpers shared by the PQ2 kernels: Triton availability and where it can run."""

from __future__ import annotations

import functools
import os

import torch

try:  # Triton is optional: CPU installs without it use the torch reference path.
    import triton  # noqa: F401
    import triton.language as tl  # noqa: F401

    HAS_TRITON = True
except ImportError:  # pragma: no cover - exercised only where triton is absent
    HAS_TRITON = False

__all__ = ["HAS_TRITON", "interpreting", "triton_can_run", "device_capability", "cdiv",
           "next_power_of_2"]


def interpreting() -> bool:
    """Whether Triton kernels run in the CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def triton_can_run(device: torch.device) -> bool:
    """Triton kernels run on CUDA tensors, or on CPU tensors under the interpreter."""
    if not HAS_TRITON:
        return False
    if device.type == "cuda":
        return not interpreting()
    return device.type == "cpu" and interpreting()


@functools.cache
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def device_capability(device: torch.device) -> tuple[int, int] | None:
    """(major, minor) of a CUDA device, None elsewhere."""
    if device.type != "cuda":
        return None
    return _capability(device.index if device.index is not None else torch.cuda.current_device())


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_power_of_2(x: int) -> int:
    return 1 if x <= 1 else 1 << (x - 1).bit_length()
