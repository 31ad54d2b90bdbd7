"""Helpers shared by every kernel of vllm-prism (PQ2 linears, attention): Triton's
availability and where it can run, the GPU's capability and multiprocessor count, and small
integer helpers, and the programmatic-dependent-launch entry of the Triton kernels. One copy
of each; free of vLLM."""

from __future__ import annotations

import functools
import os

import torch

from vllm_prism import envs

try:  # Triton is optional: CPU installs without it use the torch reference path.
    import triton  # noqa: F401
    import triton.language as tl  # noqa: F401

    HAS_TRITON = True
except ImportError:  # pragma: no cover - exercised only where triton is absent
    HAS_TRITON = False

__all__ = ["HAS_TRITON", "interpreting", "triton_can_run", "device_capability", "device_name",
           "sm_count", "cdiv", "next_power_of_2", "use_pdl", "pdl_launch", "pdl_enter",
           "pdl_release", "pdl_wait"]


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
def _properties(index: int) -> tuple[tuple[int, int], str, int]:
    p = torch.cuda.get_device_properties(index)
    return (p.major, p.minor), p.name, p.multi_processor_count


def _cuda_properties(device: torch.device) -> tuple[tuple[int, int], str, int] | None:
    if device.type != "cuda":
        return None
    return _properties(device.index if device.index is not None else torch.cuda.current_device())


def device_capability(device: torch.device) -> tuple[int, int] | None:
    """(major, minor) of a CUDA device, None elsewhere."""
    props = _cuda_properties(device)
    return None if props is None else props[0]


def device_name(device: torch.device) -> str | None:
    """The name of a CUDA device ("NVIDIA H200"), None elsewhere."""
    props = _cuda_properties(device)
    return None if props is None else props[1]


def sm_count(device: torch.device) -> int | None:
    """Multiprocessors of a CUDA device, None elsewhere (callers pick their CPU stand-in)."""
    props = _cuda_properties(device)
    return None if props is None else props[2]


@functools.cache
def _triton_has_pdl() -> bool:
    """Whether this Triton launches with programmatic dependent launch (``launch_pdl``) and
    exposes grid dependency control (``tl.extra.cuda.gdc_wait``)."""
    if not HAS_TRITON:
        return False
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
        from triton.language.extra import cuda as tl_cuda
    except ImportError:
        return False
    return ("launch_pdl" in getattr(CUDAOptions, "__dataclass_fields__", {})
            and hasattr(tl_cuda, "gdc_wait") and hasattr(tl_cuda, "gdc_launch_dependents"))


def use_pdl(device: torch.device) -> bool:
    """Whether the PQ2 kernels on ``device`` run with programmatic dependent launch: a CUDA
    GPU of compute capability 9.0 or newer (``griddepcontrol``), a Triton that supports it,
    not the interpreter, and ``VLLM_PRISM_PDL`` on (the default)."""
    cap = device_capability(device)
    return (cap is not None and cap >= (9, 0) and not interpreting() and _triton_has_pdl()
            and envs.VLLM_PRISM_PDL)


def pdl_launch(pdl: bool) -> dict:
    """The launch options of a kernel that takes a ``PDL`` constexpr: ``launch_pdl`` only when
    on (older Triton and the interpreter do not know the option)."""
    return {"launch_pdl": True} if pdl else {}


if HAS_TRITON:

    @triton.jit
    def pdl_release(PDL: tl.constexpr):
        """Let the next kernel launch (a kernel launched with ``pdl_launch``); what follows
        until :func:`pdl_wait` may read only what the kernels before this one do not write.
        Nothing without ``PDL``."""
        if PDL:
            tl.extra.cuda.gdc_launch_dependents()

    @triton.jit
    def pdl_wait(PDL: tl.constexpr):
        """Wait until this kernel's inputs (the kernels before it) are complete. Nothing
        without ``PDL``."""
        if PDL:
            tl.extra.cuda.gdc_wait()

    @triton.jit
    def pdl_enter(PDL: tl.constexpr):
        """Start of a kernel launched with ``pdl_launch``: let the next kernel launch, then
        wait until this one's inputs are complete. Nothing without ``PDL``."""
        pdl_release(PDL)
        pdl_wait(PDL)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_power_of_2(x: int) -> int:
    return 1 if x <= 1 else 1 << (x - 1).bit_length()
