"""bfloat16 <-> float32 conversions on raw bit patterns, in numpy only.

GGUF stores BF16 tensors as 16-bit words; numpy has no bfloat16 dtype, so the reader
hands them out as ``uint16`` bits and these helpers convert them (the writer uses
:func:`bf16_bits_from_float32` to store float32 data as BF16).
"""

from __future__ import annotations

import numpy as np

__all__ = ["bf16_bits_from_float32", "float32_from_bf16_bits"]


def bf16_bits_from_float32(a: np.ndarray) -> np.ndarray:
    """Round float32 values to bfloat16 (round to nearest, ties to even).

    Returns a ``uint16`` array of the same shape holding the bfloat16 bit patterns.
    Infinities are kept, values that round past the largest bfloat16 become infinity,
    and every NaN stays a (quiet) NaN with its sign.
    """
    f = np.ascontiguousarray(a, dtype=np.float32)
    bits = f.view(np.uint32)
    # Adding 0x7FFF plus the lowest kept bit rounds to nearest even; it cannot
    # overflow for non-NaN inputs (the largest is -inf, 0xFF800000).
    lsb = (bits >> np.uint32(16)) & np.uint32(1)
    rounded = ((bits + np.uint32(0x7FFF) + lsb) >> np.uint32(16)).astype(np.uint16)
    nan = np.isnan(f)
    if nan.any():
        rounded[nan] = ((bits[nan] >> np.uint32(16)) | np.uint32(0x0040)).astype(np.uint16)
    return rounded


def float32_from_bf16_bits(a: np.ndarray) -> np.ndarray:
    """Expand bfloat16 bit patterns (``uint16``) to float32 exactly."""
    bits = np.asarray(a)
    if bits.dtype != np.uint16:
        raise TypeError(f"expected uint16 bfloat16 bits, got dtype {bits.dtype}")
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)
