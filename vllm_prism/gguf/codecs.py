"""Numpy block codecs for the ggml tensor types found in Bonsai GGUF files.

Every ternary or binary format (PQ2_0, Q2_0 in both group sizes, PTQ1_0, Q1_0) is
represented the same way once decoded: signed integer values ``q`` (int8, shape
``[..., K]``) and one fp16 scale per block ``d`` (float16, shape ``[..., K // group]``);
the weight is ``q * d``. Q8_0 shares that representation (q in int8, group 32).

The block layouts follow section 1 of the Bonsai 2 GGUF spec:

* PQ2_0 and Q2_0 (group 128): fp16 ``d`` first, then 32 bytes of 2-bit codes; element
  ``j`` has code ``(qs[j // 4] >> (2 * (j % 4))) & 3`` and value ``code - 1``, so codes
  0..3 mean -1, 0, +1, +2. Q2_0 group 64 is the same with 16 bytes of codes.
* Q1_0: fp16 ``d`` then 16 bytes of sign bits, element ``j`` is bit ``j % 8`` of byte
  ``j // 8`` (LSB first); bit 1 means ``+d``, bit 0 means ``-d``.
* PTQ1_0: 24 bytes ``qs`` (5 trits per byte), 2 bytes ``qh`` (4 trits per byte), then
  fp16 ``d`` LAST. The element order is not the byte order (see ``_PTQ1_ELEMENT``).
* Q8_0: fp16 ``d`` then 32 int8 values.

All functions work on whole matrices at once (no Python loop over blocks). Bad input
raises :class:`GGUFError` with a message naming the format and the problem.
"""

from __future__ import annotations

import numpy as np

from vllm_prism.gguf.constants import (
    GGML_BLOCK_LAYOUTS,
    Q2_0_G64_LAYOUT,
    BlockLayout,
    GGMLType,
)
from vllm_prism.gguf.errors import GGUFError

__all__ = ["block_layout", "dequantize", "pack_blocks", "quantize_ternary", "unpack_blocks"]

# Types pack_blocks / unpack_blocks handle, with the allowed range of q.
_Q_RANGE: dict[GGMLType, tuple[int, int]] = {
    GGMLType.PQ2_0: (-1, 2),
    GGMLType.Q2_0: (-1, 2),
    GGMLType.PTQ1_0: (-1, 1),
    GGMLType.Q1_0: (-1, 1),  # and 0 is excluded: see check_q_values
    GGMLType.Q8_0: (-128, 127),
}
# Types quantize_ternary produces.
TERNARY_QUANT_TYPES = frozenset(
    {GGMLType.PQ2_0, GGMLType.Q2_0, GGMLType.PTQ1_0, GGMLType.Q1_0})

_FP16_BYTES = 2
PTQ1_QS_BYTES = 24
PTQ1_QH_BYTES = 2
_POW3 = (1, 3, 9, 27, 81)


def _build_ptq1_element_map() -> np.ndarray:
    """Element index of digit ``n`` (0 = most significant) of payload byte ``b``.

    Returns int64 [26, 5]: rows 0..23 are ``qs``, rows 24..25 are ``qh``; ``qh`` bytes
    hold only 4 trits, their fifth digit (always 0 in a valid byte) is marked -1.
    """
    table = np.full((PTQ1_QS_BYTES + PTQ1_QH_BYTES, 5), -1, dtype=np.int64)
    for n in range(5):
        for m in range(16):  # elements 0..79: element 16n + m is digit n of qs[m]
            table[m, n] = 16 * n + m
        for m in range(8):  # elements 80..119: element 80 + 8n + m is digit n of qs[16+m]
            table[16 + m, n] = 80 + 8 * n + m
    for n in range(4):
        for h in range(2):  # elements 120..127: element 120 + 2n + h is digit n of qh[h]
            table[24 + h, n] = 120 + 2 * n + h
    return table


_PTQ1_ELEMENT = _build_ptq1_element_map()
# Element indices of the qs digits, [24, 5], and of the qh digits, [2, 4] (shared with
# codecs_torch, as are the check_* helpers below).
PTQ1_QS_ELEMENT = _PTQ1_ELEMENT[:PTQ1_QS_BYTES]
PTQ1_QH_ELEMENT = _PTQ1_ELEMENT[PTQ1_QS_BYTES:, :4]
# Flattened (qs digits, then qh digits) position of each element 0..127.
PTQ1_GATHER = np.argsort(
    np.concatenate([PTQ1_QS_ELEMENT.reshape(-1), PTQ1_QH_ELEMENT.reshape(-1)]))


def block_layout(ggml_type: GGMLType, group: int | None = None) -> BlockLayout:
    """Block layout of a type handled by the codecs; ``group`` only selects Q2_0's."""
    ggml_type = _as_type(ggml_type)
    if ggml_type not in _Q_RANGE:
        raise GGUFError(
            f"{ggml_type.name}: the block codecs handle only "
            f"{', '.join(t.name for t in _Q_RANGE)}")
    if ggml_type == GGMLType.Q2_0:
        if group is None or group == 128:
            return GGML_BLOCK_LAYOUTS[GGMLType.Q2_0]
        if group == 64:
            return Q2_0_G64_LAYOUT
        raise GGUFError(f"Q2_0: group must be 128 or 64, got {group}")
    layout = GGML_BLOCK_LAYOUTS[ggml_type]
    if group is not None and group != layout.block_size:
        raise GGUFError(
            f"{ggml_type.name}: group is fixed at {layout.block_size}, got {group}")
    return layout


def _as_type(ggml_type: GGMLType | int) -> GGMLType:
    try:
        return GGMLType(ggml_type)
    except ValueError:
        raise GGUFError(f"unknown ggml tensor type {ggml_type!r}") from None


def check_q_values(name: str, ggml_type: GGMLType, qmin: int, qmax: int,
                   has_zero: bool) -> None:
    """Raise when the extreme values / presence of zero are illegal for the type."""
    lo, hi = _Q_RANGE[ggml_type]
    if qmin < lo or qmax > hi:
        raise GGUFError(
            f"{name}: q values must lie in [{lo}, {hi}], got min {qmin} max {qmax}")
    if ggml_type == GGMLType.Q1_0 and has_zero:
        raise GGUFError(f"{name}: q values must be -1 or +1 (Q1_0 has no zero), got 0")


def check_pack_shapes(name: str, q_shape: tuple[int, ...], d_shape: tuple[int, ...],
                      group: int) -> int:
    """Validate q [..., K] against d [..., K // group]; returns the number of blocks."""
    if len(q_shape) == 0:
        raise GGUFError(f"{name}: q must have at least one dimension")
    k = q_shape[-1]
    if k % group != 0:
        raise GGUFError(f"{name}: K = {k} is not a multiple of the group size {group}")
    n_blocks = k // group
    if tuple(d_shape) != tuple(q_shape[:-1]) + (n_blocks,):
        raise GGUFError(
            f"{name}: d has shape {tuple(d_shape)}, expected "
            f"{tuple(q_shape[:-1]) + (n_blocks,)} for q of shape {tuple(q_shape)}")
    return n_blocks


def check_row_bytes(name: str, raw_shape: tuple[int, ...], type_size: int) -> int:
    """Validate raw [..., row_bytes]; returns the number of blocks per row."""
    if len(raw_shape) == 0:
        raise GGUFError(f"{name}: raw data must have at least one dimension")
    row_bytes = raw_shape[-1]
    if row_bytes % type_size != 0:
        raise GGUFError(
            f"{name}: {row_bytes} bytes per row is not a multiple of the "
            f"{type_size}-byte block")
    return row_bytes // type_size


def format_name(ggml_type: GGMLType, group: int | None) -> str:
    """Name used in messages: the type, plus the group for Q2_0 group 64."""
    if ggml_type == GGMLType.Q2_0 and group == 64:
        return "Q2_0 (group 64)"
    return ggml_type.name


# ----------------------------------------------------------------------------- packing


def _pack_2bit(q: np.ndarray) -> np.ndarray:
    """[..., G] values in -1..2 -> [..., G // 4] bytes, element 4k + i in bits 2i..2i+1."""
    codes = (q + 1).astype(np.uint8).reshape(*q.shape[:-1], -1, 4)
    return (codes[..., 0] | (codes[..., 1] << 2) | (codes[..., 2] << 4)
            | (codes[..., 3] << 6)).astype(np.uint8)


def _unpack_2bit(qs: np.ndarray) -> np.ndarray:
    """[..., G // 4] bytes -> [..., G] int8 values code - 1."""
    shifts = np.array([0, 2, 4, 6], dtype=np.uint8)
    codes = (qs[..., None] >> shifts) & np.uint8(3)
    return codes.reshape(*qs.shape[:-1], -1).astype(np.int8) - np.int8(1)


def _pack_1bit(q: np.ndarray) -> np.ndarray:
    """[..., G] values +-1 -> [..., G // 8] bytes, element j = bit j % 8 of byte j // 8."""
    return np.packbits(q > 0, axis=-1, bitorder="little")


def _unpack_1bit(qs: np.ndarray) -> np.ndarray:
    """[..., G // 8] bytes -> [..., G] int8 values in {-1, +1}."""
    bits = np.unpackbits(qs, axis=-1, bitorder="little").astype(np.int8)
    return bits * np.int8(2) - np.int8(1)


def _trits_to_byte(trits: np.ndarray) -> np.ndarray:
    """[..., 5] trits (most significant first) -> byte ceil(Q * 256 / 243)."""
    value = np.zeros(trits.shape[:-1], dtype=np.uint16)
    for n in range(5):
        value = value * np.uint16(3) + trits[..., n].astype(np.uint16)
    # Q <= 242, so Q * 256 + 242 <= 62194 fits in uint16.
    return ((value * np.uint16(256) + np.uint16(242)) // np.uint16(243)).astype(np.uint8)


def _byte_to_trits(b: np.ndarray, n_digits: int) -> np.ndarray:
    """bytes [...] -> [..., n_digits] trits; digit n is ((uint8)(b * 3^n) * 3) >> 8."""
    digits = [((b * np.uint8(_POW3[n])).astype(np.uint16) * np.uint16(3)) >> np.uint16(8)
              for n in range(n_digits)]  # uint8 * uint8 wraps modulo 256, as in C
    return np.stack(digits, axis=-1).astype(np.int8)


def _pack_ptq1(q: np.ndarray) -> np.ndarray:
    """[..., 128] values in -1..1 -> [..., 26] bytes (24 qs then 2 qh)."""
    trits = (q + 1).astype(np.uint8)
    qs = _trits_to_byte(trits[..., PTQ1_QS_ELEMENT])  # [..., 24]
    qh_trits = np.concatenate(  # 4 trits and a trailing 0: Q = 3 * Q4
        [trits[..., PTQ1_QH_ELEMENT], np.zeros((*q.shape[:-1], 2, 1), np.uint8)], axis=-1)
    qh = _trits_to_byte(qh_trits)  # [..., 2]
    return np.concatenate([qs, qh], axis=-1)


def _unpack_ptq1(payload: np.ndarray) -> np.ndarray:
    """[..., 26] bytes (24 qs then 2 qh) -> [..., 128] int8 values in -1..1."""
    qs_digits = _byte_to_trits(payload[..., :PTQ1_QS_BYTES], 5)  # [..., 24, 5]
    qh_digits = _byte_to_trits(payload[..., PTQ1_QS_BYTES:], 4)  # [..., 2, 4]
    flat = np.concatenate([qs_digits.reshape(*payload.shape[:-1], -1),
                           qh_digits.reshape(*payload.shape[:-1], -1)], axis=-1)
    return flat[..., PTQ1_GATHER] - np.int8(1)


def _d_to_bytes(d: np.ndarray) -> np.ndarray:
    """fp16 [...] -> little-endian bytes [..., 2]."""
    return np.ascontiguousarray(d.astype("<f2")).view(np.uint8).reshape(*d.shape, 2)


def _bytes_to_d(b: np.ndarray) -> np.ndarray:
    """little-endian bytes [..., 2] -> fp16 [...]."""
    return np.ascontiguousarray(b).view("<f2")[..., 0].astype(np.float16)


def pack_blocks(q: np.ndarray, d: np.ndarray, ggml_type: GGMLType, *,
                group: int | None = None) -> np.ndarray:
    """Encode values ``q`` [..., K] and scales ``d`` [..., K // group] into raw blocks.

    Returns uint8 [..., K // group * type_size]. ``group`` is only for Q2_0 (128, the
    default, or 64). ``d`` is converted to float16.
    """
    ggml_type = _as_type(ggml_type)
    layout = block_layout(ggml_type, group)
    name = format_name(ggml_type, layout.block_size)
    q = np.asarray(q)
    d = np.asarray(d)
    if not np.issubdtype(q.dtype, np.integer):
        raise GGUFError(f"{name}: q must be an integer array, got {q.dtype}")
    if not np.issubdtype(d.dtype, np.floating):
        raise GGUFError(f"{name}: d must be a floating-point array, got {d.dtype}")
    n_blocks = check_pack_shapes(name, q.shape, d.shape, layout.block_size)
    if q.size:
        check_q_values(name, ggml_type, int(q.min()), int(q.max()),
                        bool(ggml_type == GGMLType.Q1_0 and (q == 0).any()))
    lead = q.shape[:-1]
    qb = q.reshape(*lead, n_blocks, layout.block_size).astype(np.int16)
    d_bytes = _d_to_bytes(d.astype(np.float16))  # [..., n_blocks, 2]
    if ggml_type in (GGMLType.PQ2_0, GGMLType.Q2_0):
        blocks = np.concatenate([d_bytes, _pack_2bit(qb)], axis=-1)
    elif ggml_type == GGMLType.Q1_0:
        blocks = np.concatenate([d_bytes, _pack_1bit(qb)], axis=-1)
    elif ggml_type == GGMLType.PTQ1_0:
        blocks = np.concatenate([_pack_ptq1(qb), d_bytes], axis=-1)
    else:  # Q8_0
        blocks = np.concatenate([d_bytes, qb.astype(np.int8).view(np.uint8)], axis=-1)
    return np.ascontiguousarray(blocks).reshape(*lead, n_blocks * layout.type_size)


def unpack_blocks(raw: np.ndarray, ggml_type: GGMLType, *,
                  group: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Decode raw blocks uint8 [..., row_bytes] into (q int8 [..., K], d fp16 [..., K // group])."""
    ggml_type = _as_type(ggml_type)
    layout = block_layout(ggml_type, group)
    name = format_name(ggml_type, layout.block_size)
    raw = np.asarray(raw)
    if raw.dtype != np.uint8:
        raise GGUFError(f"{name}: raw data must be uint8, got {raw.dtype}")
    n_blocks = check_row_bytes(name, raw.shape, layout.type_size)
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
            q = np.ascontiguousarray(payload).view(np.int8)
    return q.reshape(*lead, n_blocks * layout.block_size), d


# ------------------------------------------------------------------------- dequantize


def _dequantize_float(raw: np.ndarray, ggml_type: GGMLType) -> np.ndarray:
    """F32 / F16 / BF16 given as the typed array (BF16: uint16 bits) or as uint8 bytes."""
    name = ggml_type.name
    raw = np.asarray(raw)
    if ggml_type == GGMLType.F32:
        typed, bits = np.float32, np.float32
    elif ggml_type == GGMLType.F16:
        typed, bits = np.float16, np.float16
    else:
        typed, bits = np.uint16, np.uint16
    if raw.dtype == np.uint8:
        width = np.dtype(bits).itemsize
        check_row_bytes(name, raw.shape, width)
        raw = np.ascontiguousarray(raw).view(np.dtype(bits).newbyteorder("<"))
    elif ggml_type == GGMLType.BF16 and raw.dtype.name in ("int16", "bfloat16"):
        raw = raw.view(np.uint16)  # bfloat16: the ml_dtypes type, if the caller has one
    elif raw.dtype != typed:
        raise GGUFError(
            f"{name}: expected a {np.dtype(typed).name} or uint8 array, got {raw.dtype}")
    if ggml_type == GGMLType.BF16:
        return (raw.astype(np.uint32) << np.uint32(16)).view(np.float32)
    return raw.astype(np.float32)


def dequantize(raw: np.ndarray, ggml_type: GGMLType, *,
               group: int | None = None) -> np.ndarray:
    """Dequantize ``raw`` to float32 [..., K].

    Block types take uint8 [..., row_bytes]. F32 / F16 take the typed array, BF16 its
    uint16 bit pattern; all three also accept little-endian uint8 bytes.
    """
    ggml_type = _as_type(ggml_type)
    if ggml_type in (GGMLType.F32, GGMLType.F16, GGMLType.BF16):
        if group is not None:
            raise GGUFError(f"{ggml_type.name}: group does not apply, got {group}")
        return _dequantize_float(raw, ggml_type)
    layout = block_layout(ggml_type, group)
    q, d = unpack_blocks(raw, ggml_type, group=group)
    lead = q.shape[:-1]
    n_blocks = d.shape[-1]
    w = (q.reshape(*lead, n_blocks, layout.block_size).astype(np.float32)
         * d.astype(np.float32)[..., None])
    return w.reshape(q.shape)


# --------------------------------------------------------------------------- quantize


def quantize_ternary(x: np.ndarray, ggml_type: GGMLType, *,
                     group: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The spec's reference quantizer: (q int8 [..., K], d fp16 [..., K // group]).

    PQ2_0 / Q2_0 / PTQ1_0: ``d = max|x|`` per group, ``q = clamp(round(x / d), -1, 1)``
    (round half away from zero, as llama.cpp's ``lroundf``; the division uses the fp32
    maximum, before ``d`` is rounded to fp16). Q1_0: ``d = mean|x|``, ``q = sign(x)``
    with ``+1`` for ``x >= 0``. An all-zero group gets ``d = 0`` and ``q = 0`` (Q1_0:
    ``q = +1``).
    """
    ggml_type = _as_type(ggml_type)
    if ggml_type not in TERNARY_QUANT_TYPES:
        raise GGUFError(f"{ggml_type.name}: quantize_ternary handles only "
                        f"{', '.join(sorted(t.name for t in TERNARY_QUANT_TYPES))}")
    layout = block_layout(ggml_type, group)
    name = format_name(ggml_type, layout.block_size)
    x = np.asarray(x)
    if not np.issubdtype(x.dtype, np.floating):
        raise GGUFError(f"{name}: x must be a floating-point array, got {x.dtype}")
    if x.ndim == 0 or x.shape[-1] % layout.block_size != 0:
        k = x.shape[-1] if x.ndim else None
        raise GGUFError(
            f"{name}: K = {k} is not a multiple of the group size {layout.block_size}")
    lead = x.shape[:-1]
    xb = x.astype(np.float32).reshape(*lead, -1, layout.block_size)
    if ggml_type == GGMLType.Q1_0:
        # Accumulate in float64 so the fp16 result does not depend on summation order.
        scale = np.abs(xb).mean(axis=-1, dtype=np.float64).astype(np.float32)
        q = np.where(xb >= 0, np.int8(1), np.int8(-1))
    else:
        scale = np.abs(xb).max(axis=-1)
        with np.errstate(divide="ignore"):
            inv = np.where(scale > 0, np.float32(1) / scale, np.float32(0))
        v = xb * inv[..., None]
        rounded = np.sign(v) * np.floor(np.abs(v) + np.float32(0.5))
        q = np.clip(rounded, -1, 1).astype(np.int8)
    return q.reshape(x.shape), scale.astype(np.float16)
