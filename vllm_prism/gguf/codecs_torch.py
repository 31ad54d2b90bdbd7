"""Torch block codecs: the reference path GPU kernels are tested against.

Same formats, representation and API as :mod:`vllm_prism.gguf.codecs` (see its
docstring for the block layouts), over torch tensors on any device: raw blocks are
uint8, values ``q`` int8 and scales ``d`` float16. Everything is plain vectorised torch
ops, written to be obviously right rather than fast. Byte-level views assume a
little-endian host, as GGUF files are little-endian and so are x86, ARM and CUDA.
"""

from __future__ import annotations

import torch

from vllm_prism.gguf.codecs import (
    PTQ1_GATHER,
    PTQ1_QH_ELEMENT,
    PTQ1_QS_BYTES,
    PTQ1_QS_ELEMENT,
    TERNARY_QUANT_TYPES,
    block_layout,
    check_pack_shapes,
    check_q_values,
    check_row_bytes,
    format_name,
)
from vllm_prism.gguf.constants import GGMLType
from vllm_prism.gguf.errors import GGUFError

__all__ = ["dequantize", "dequantize_to", "pack_blocks", "quantize_ternary",
           "unpack_blocks"]

_FP16_BYTES = 2
_FLOAT_TYPES = {
    GGMLType.F32: torch.float32,
    GGMLType.F16: torch.float16,
    GGMLType.BF16: torch.bfloat16,
}


def _as_type(ggml_type: GGMLType | int) -> GGMLType:
    try:
        return GGMLType(ggml_type)
    except ValueError:
        raise GGUFError(f"unknown ggml tensor type {ggml_type!r}") from None


def _is_integer(dtype: torch.dtype) -> bool:
    return not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool)


# ----------------------------------------------------------------------------- packing


def _pack_2bit(q: torch.Tensor) -> torch.Tensor:
    """[..., G] values in -1..2 -> [..., G // 4] bytes, element 4k + i in bits 2i..2i+1."""
    codes = (q + 1).to(torch.uint8).reshape(*q.shape[:-1], -1, 4)
    return codes[..., 0] | (codes[..., 1] << 2) | (codes[..., 2] << 4) | (codes[..., 3] << 6)


def _unpack_2bit(qs: torch.Tensor) -> torch.Tensor:
    """[..., G // 4] bytes -> [..., G] int8 values code - 1."""
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8, device=qs.device)
    codes = (qs.unsqueeze(-1) >> shifts) & 3
    return codes.reshape(*qs.shape[:-1], -1).to(torch.int8) - 1


def _pack_1bit(q: torch.Tensor) -> torch.Tensor:
    """[..., G] values +-1 -> [..., G // 8] bytes, element j = bit j % 8 of byte j // 8."""
    bits = (q > 0).to(torch.uint8).reshape(*q.shape[:-1], -1, 8)
    packed = bits[..., 0]
    for i in range(1, 8):
        packed = packed | (bits[..., i] << i)
    return packed


def _unpack_1bit(qs: torch.Tensor) -> torch.Tensor:
    """[..., G // 8] bytes -> [..., G] int8 values in {-1, +1}."""
    shifts = torch.arange(8, dtype=torch.uint8, device=qs.device)
    bits = (qs.unsqueeze(-1) >> shifts) & 1
    return bits.reshape(*qs.shape[:-1], -1).to(torch.int8) * 2 - 1


def _trits_to_byte(trits: torch.Tensor) -> torch.Tensor:
    """[..., 5] int32 trits (most significant first) -> byte ceil(Q * 256 / 243)."""
    pow3 = torch.tensor([81, 27, 9, 3, 1], dtype=torch.int32, device=trits.device)
    value = (trits * pow3).sum(dim=-1)
    return torch.div(value * 256 + 242, 243, rounding_mode="floor").to(torch.uint8)


def _byte_to_trits(b: torch.Tensor, n_digits: int) -> torch.Tensor:
    """bytes [...] -> [..., n_digits] int8 trits; digit n is ((uint8)(b * 3^n) * 3) >> 8."""
    pow3 = torch.tensor([1, 3, 9, 27, 81][:n_digits], dtype=torch.int32, device=b.device)
    wrapped = (b.to(torch.int32).unsqueeze(-1) * pow3) & 0xFF
    return ((wrapped * 3) >> 8).to(torch.int8)


def _pack_ptq1(q: torch.Tensor) -> torch.Tensor:
    """[..., 128] values in -1..1 -> [..., 26] bytes (24 qs then 2 qh)."""
    device = q.device
    trits = (q + 1).to(torch.int32)
    qs_idx = torch.from_numpy(PTQ1_QS_ELEMENT).to(device)
    qh_idx = torch.from_numpy(PTQ1_QH_ELEMENT).to(device)
    qs = _trits_to_byte(trits[..., qs_idx])  # [..., 24]
    qh_trits = trits[..., qh_idx]  # [..., 2, 4]; append a 0 digit: Q = 3 * Q4
    qh = _trits_to_byte(torch.cat([qh_trits, torch.zeros_like(qh_trits[..., :1])], dim=-1))
    return torch.cat([qs, qh], dim=-1)


def _unpack_ptq1(payload: torch.Tensor) -> torch.Tensor:
    """[..., 26] bytes (24 qs then 2 qh) -> [..., 128] int8 values in -1..1."""
    lead = payload.shape[:-1]
    qs_digits = _byte_to_trits(payload[..., :PTQ1_QS_BYTES], 5).reshape(*lead, -1)
    qh_digits = _byte_to_trits(payload[..., PTQ1_QS_BYTES:], 4).reshape(*lead, -1)
    flat = torch.cat([qs_digits, qh_digits], dim=-1)
    return flat[..., torch.from_numpy(PTQ1_GATHER).to(payload.device)] - 1


def _d_to_bytes(d: torch.Tensor) -> torch.Tensor:
    """fp16 [..., n] -> bytes [..., n, 2] (host byte order, little-endian)."""
    return d.to(torch.float16).contiguous().view(torch.uint8).reshape(*d.shape, 2)


def _bytes_to_d(b: torch.Tensor) -> torch.Tensor:
    """bytes [..., n, 2] -> fp16 [..., n]."""
    return b.contiguous().view(torch.float16).squeeze(-1)


def pack_blocks(q: torch.Tensor, d: torch.Tensor, ggml_type: GGMLType, *,
                group: int | None = None) -> torch.Tensor:
    """Encode values ``q`` [..., K] and scales ``d`` [..., K // group] into raw blocks.

    Returns uint8 [..., K // group * type_size] on ``q``'s device. ``group`` is only for
    Q2_0 (128, the default, or 64). ``d`` is converted to float16.
    """
    ggml_type = _as_type(ggml_type)
    layout = block_layout(ggml_type, group)
    name = format_name(ggml_type, layout.block_size)
    if not _is_integer(q.dtype):
        raise GGUFError(f"{name}: q must be an integer tensor, got {q.dtype}")
    if not d.dtype.is_floating_point:
        raise GGUFError(f"{name}: d must be a floating-point tensor, got {d.dtype}")
    n_blocks = check_pack_shapes(name, tuple(q.shape), tuple(d.shape), layout.block_size)
    if q.numel():
        check_q_values(name, ggml_type, int(q.min()), int(q.max()),
                       bool(ggml_type == GGMLType.Q1_0 and (q == 0).any()))
    lead = q.shape[:-1]
    qb = q.reshape(*lead, n_blocks, layout.block_size).to(torch.int16)
    d_bytes = _d_to_bytes(d.to(q.device))  # [..., n_blocks, 2]
    if ggml_type in (GGMLType.PQ2_0, GGMLType.Q2_0):
        blocks = torch.cat([d_bytes, _pack_2bit(qb)], dim=-1)
    elif ggml_type == GGMLType.Q1_0:
        blocks = torch.cat([d_bytes, _pack_1bit(qb)], dim=-1)
    elif ggml_type == GGMLType.PTQ1_0:
        blocks = torch.cat([_pack_ptq1(qb), d_bytes], dim=-1)
    else:  # Q8_0
        blocks = torch.cat([d_bytes, qb.to(torch.int8).view(torch.uint8)], dim=-1)
    return blocks.reshape(*lead, n_blocks * layout.type_size)


def unpack_blocks(raw: torch.Tensor, ggml_type: GGMLType, *,
                  group: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode uint8 [..., row_bytes] into (q int8 [..., K], d fp16 [..., K // group])."""
    ggml_type = _as_type(ggml_type)
    layout = block_layout(ggml_type, group)
    name = format_name(ggml_type, layout.block_size)
    if raw.dtype != torch.uint8:
        raise GGUFError(f"{name}: raw data must be uint8, got {raw.dtype}")
    n_blocks = check_row_bytes(name, tuple(raw.shape), layout.type_size)
    lead = raw.shape[:-1]
    blocks = raw.reshape(*lead, n_blocks, layout.type_size)
    if ggml_type == GGMLType.PTQ1_0:
        d = _bytes_to_d(blocks[..., -_FP16_BYTES:])
        q = _unpack_ptq1(blocks[..., :-_FP16_BYTES])
    else:
        d = _bytes_to_d(blocks[..., :_FP16_BYTES])
        payload = blocks[..., _FP16_BYTES:]
        if ggml_type in (GGMLType.PQ2_0, GGMLType.Q2_0):
            q = _unpack_2bit(payload)
        elif ggml_type == GGMLType.Q1_0:
            q = _unpack_1bit(payload)
        else:  # Q8_0
            q = payload.contiguous().view(torch.int8)
    return q.reshape(*lead, n_blocks * layout.block_size), d


# ------------------------------------------------------------------------- dequantize


def _dequantize_float(raw: torch.Tensor, ggml_type: GGMLType) -> torch.Tensor:
    """F32 / F16 / BF16 given as the typed tensor, as uint8 bytes or (BF16) int16 bits."""
    name = ggml_type.name
    typed = _FLOAT_TYPES[ggml_type]
    if raw.dtype == torch.uint8:
        check_row_bytes(name, tuple(raw.shape), typed.itemsize)
        raw = raw.contiguous().view(typed)
    elif ggml_type == GGMLType.BF16 and raw.dtype in (torch.int16, torch.uint16):
        raw = raw.view(torch.bfloat16)
    elif raw.dtype != typed:
        raise GGUFError(f"{name}: expected a {typed} or uint8 tensor, got {raw.dtype}")
    return raw.to(torch.float32)


def dequantize(raw: torch.Tensor, ggml_type: GGMLType, *,
               group: int | None = None) -> torch.Tensor:
    """Dequantize ``raw`` to float32 [..., K] on ``raw``'s device.

    Block types take uint8 [..., row_bytes]. F32 / F16 / BF16 take the typed tensor (BF16
    also its int16 / uint16 bit pattern) or little-endian uint8 bytes.
    """
    ggml_type = _as_type(ggml_type)
    if ggml_type in _FLOAT_TYPES:
        if group is not None:
            raise GGUFError(f"{ggml_type.name}: group does not apply, got {group}")
        return _dequantize_float(raw, ggml_type)
    layout = block_layout(ggml_type, group)
    q, d = unpack_blocks(raw, ggml_type, group=group)
    lead = q.shape[:-1]
    n_blocks = d.shape[-1]
    w = (q.reshape(*lead, n_blocks, layout.block_size).to(torch.float32)
         * d.to(torch.float32).unsqueeze(-1))
    return w.reshape(q.shape)


def dequantize_to(raw: torch.Tensor, ggml_type: GGMLType,
                  dtype: torch.dtype = torch.float32, *,
                  group: int | None = None) -> torch.Tensor:
    """:func:`dequantize`, then one rounding to ``dtype`` (``q * d`` is exact in fp32)."""
    return dequantize(raw, ggml_type, group=group).to(dtype)


# --------------------------------------------------------------------------- quantize


def quantize_ternary(x: torch.Tensor, ggml_type: GGMLType, *,
                     group: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The spec's reference quantizer: (q int8 [..., K], d fp16 [..., K // group]).

    Same rules as :func:`vllm_prism.gguf.codecs.quantize_ternary`: ``d = max|x|`` and
    ``q = clamp(round_half_away(x / d), -1, 1)``; Q1_0 ``d = mean|x|``, ``q = sign(x)``
    with ``+1`` for ``x >= 0``; an all-zero group gets ``d = 0``, ``q = 0`` (Q1_0: +1).
    """
    ggml_type = _as_type(ggml_type)
    if ggml_type not in TERNARY_QUANT_TYPES:
        raise GGUFError(f"{ggml_type.name}: quantize_ternary handles only "
                        f"{', '.join(sorted(t.name for t in TERNARY_QUANT_TYPES))}")
    layout = block_layout(ggml_type, group)
    name = format_name(ggml_type, layout.block_size)
    if not x.dtype.is_floating_point:
        raise GGUFError(f"{name}: x must be a floating-point tensor, got {x.dtype}")
    if x.dim() == 0 or x.shape[-1] % layout.block_size != 0:
        k = x.shape[-1] if x.dim() else None
        raise GGUFError(
            f"{name}: K = {k} is not a multiple of the group size {layout.block_size}")
    lead = x.shape[:-1]
    xb = x.to(torch.float32).reshape(*lead, -1, layout.block_size)
    if ggml_type == GGMLType.Q1_0:
        scale = xb.abs().to(torch.float64).mean(dim=-1).to(torch.float32)
        q = torch.where(xb >= 0, 1, -1).to(torch.int8)
    else:
        scale = xb.abs().amax(dim=-1)
        inv = torch.where(scale > 0, 1.0 / scale, torch.zeros_like(scale))
        v = xb * inv.unsqueeze(-1)
        rounded = torch.sign(v) * torch.floor(v.abs() + 0.5)
        q = rounded.clamp(-1, 1).to(torch.int8)
    return q.reshape(x.shape), scale.to(torch.float16)
