"""Prepared weight layouts for the PQ2_0 and PTQ1_0 kernels, built once after loading.

A GGUF PQ2_0 row is K/128 blocks of 34 bytes (fp16 scale ``d`` first, then 32 bytes of
2-bit codes). Interleaving scales and codes makes wide, aligned loads impossible, so the
kernels read two planes instead:

* ``codes``: int32 ``[N, K/16]``. Word ``w`` of a row holds elements ``16w .. 16w+15``;
  element ``16w + 4q + b`` sits at bits ``8b + 2q`` (byte ``b``, field ``q``): the 4 x 4 grid
  of (byte, field) of a GGUF word, transposed. So ``(word >> 2q) & 0x03030303`` holds the
  codes of the four consecutive elements ``4q .. 4q+3`` as bytes: the partner of one int8
  activation word in ``dp4a`` (the GEMV), and the tensor-core kernels expand a whole word in
  one thread into 16 consecutive K values.
* ``scales``: fp16 ``[N, G_pad]`` with ``G = K/128`` blocks, the row stride padded to a
  multiple of 8 so every row starts 16-byte aligned.

PTQ1_0 (28-byte blocks: 24 bytes ``qs``, 2 bytes ``qh``, fp16 ``d`` last) keeps its trits:
``qs`` int32 ``[N, G*6]``, ``qh`` uint8 ``[N, G*2]`` and the same ``scales`` plane.

The optional Hadamard fold travels with the weight: ``signs`` (float32 ``[K]``, +-1) and
``hadamard_block``; the linear op then computes ``y = W_st @ Hblk(signs * x)``.

Preparing a plane also checks whether its codes hold a 3 (the value +2, legal in the PQ2_0
container, never written by a ternary checkpoint). Planes without one are recorded by address
(:func:`note_ternary_plane`, :func:`is_ternary_plane`; planes are not written after
preparation): the prefill kernel ``wgmma_fold`` folds their group scales at twice the
resolution.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from vllm_prism.gguf import codecs_torch
from vllm_prism.gguf.constants import GGMLType

__all__ = ["PQ2Weight", "PTQ1Weight", "GROUP", "PQ2_BLOCK_BYTES", "PTQ1_BLOCK_BYTES",
           "note_ternary_plane", "is_ternary_plane"]

GROUP = 128
PQ2_BLOCK_BYTES = 34
PTQ1_BLOCK_BYTES = 28
_SCALE_ALIGN = 8  # fp16 elements: 16 bytes


def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def _check_raw(raw: torch.Tensor, block_bytes: int, fmt: str) -> tuple[int, int]:
    """Validate uint8 [N, G * block_bytes]; returns (N, G)."""
    if raw.dtype != torch.uint8 or raw.dim() != 2:
        raise ValueError(f"{fmt}: raw weight must be a 2-D uint8 tensor [N, K/128*{block_bytes}],"
                         f" got {raw.dtype} with shape {tuple(raw.shape)}")
    n, row_bytes = raw.shape
    if row_bytes == 0 or row_bytes % block_bytes:
        raise ValueError(f"{fmt}: {row_bytes} bytes per row is not a positive multiple of the "
                         f"{block_bytes}-byte block")
    return int(n), row_bytes // block_bytes


def _check_transform(k: int, signs: torch.Tensor | None, hadamard_block: int | None,
                     device: torch.device) -> tuple[torch.Tensor | None, int | None]:
    """Validate the optional fold; returns (signs as contiguous float32 on ``device``, block),
    both None without signs (a weight that is not folded: ``hadamard_block`` alone is
    ignored)."""
    if signs is None:
        return None, None
    if hadamard_block is None:
        raise ValueError("signs given without hadamard_block")
    block = int(hadamard_block)
    if block <= 0 or block & (block - 1) or k % block:
        raise ValueError(f"hadamard_block must be a power of two dividing K = {k}, got {block}")
    signs = torch.as_tensor(signs).reshape(-1)
    if signs.numel() != k:
        raise ValueError(f"signs has {signs.numel()} values, expected K = {k}")
    return signs.to(device=device, dtype=torch.float32).contiguous(), block


def _ptq1_rows_as_pq2(rows: torch.Tensor) -> torch.Tensor:
    """PTQ1_0 rows re-encoded as PQ2_0 rows (the same values: a lossless transcode)."""
    q, d = codecs_torch.unpack_blocks(rows, GGMLType.PTQ1_0)
    return codecs_torch.pack_blocks(q, d, GGMLType.PQ2_0)


def _packed(t: torch.Tensor) -> torch.Tensor:
    """A fresh contiguous copy at storage offset 0 (so it can be viewed as wider types)."""
    return t.clone(memory_format=torch.contiguous_format)


def _transpose_fields(code_bytes: torch.Tensor) -> torch.Tensor:
    """GGUF code bytes [..., 4m] (element 4i + j at bits 2j of byte i) -> prepared int32
    words [..., m] (element 16w + 4q + b at bits 8b + 2q of word w). Self-inverse on bytes."""
    b = code_bytes.reshape(*code_bytes.shape[:-1], -1, 4)  # [..., word, byte i]
    fields = torch.stack([(b >> (2 * j)) & 3 for j in range(4)], dim=-1)
    # fields[..., w, i, j] is element 4i + j; new byte j collects elements 4i + j, field i
    t = fields.transpose(-1, -2)  # [..., w, j (new byte), i (new field)]
    out = t[..., 0] | (t[..., 1] << 2) | (t[..., 2] << 4) | (t[..., 3] << 6)
    return out.to(torch.uint8).reshape(*code_bytes.shape[:-1], -1)


def _transpose_rows(code_bytes: torch.Tensor, chunk: int = 8192) -> torch.Tensor:
    """:func:`_transpose_fields` over row chunks, bounding the temporary memory."""
    out = torch.empty_like(code_bytes)
    for r0 in range(0, code_bytes.shape[0], chunk):
        out[r0:r0 + chunk] = _transpose_fields(code_bytes[r0:r0 + chunk])
    return out


# Code planes found by _pq2_planes to hold no 3, by device and address. Weakly held: a freed
# plane's entry goes with it, so a later tensor at the same address is never taken for it.
_TERNARY_PLANES: weakref.WeakValueDictionary[tuple[str, int], torch.Tensor] = (
    weakref.WeakValueDictionary())


def note_ternary_plane(codes: torch.Tensor) -> None:
    """Record ``codes``, a plane prepared here and checked to hold no code 3 (or a Parameter
    over one, which then keeps the record alive), for :func:`is_ternary_plane`."""
    _TERNARY_PLANES[(str(codes.device), codes.data_ptr())] = codes


def is_ternary_plane(codes: torch.Tensor) -> bool:
    """Whether ``codes`` is a recorded plane (same device, address, shape, strides and dtype
    as one still alive); False for anything else, the safe answer."""
    t = _TERNARY_PLANES.get((str(codes.device), codes.data_ptr()))
    return (t is not None and t.shape == codes.shape and t.stride() == codes.stride()
            and t.dtype == codes.dtype)


def _has_code3(words: torch.Tensor) -> torch.Tensor:
    """Whether int32 code words hold a 3 (both bits of a 2-bit field set), as a 0-d bool on
    their device (no host sync). The shift is arithmetic: bit 30 of ``words >> 1`` is bit 31."""
    return ((words & (words >> 1)) & 0x55555555).ne(0).any()


def _pq2_planes(n: int, groups: int, device: torch.device,
                rows_of: Callable[[int, int], torch.Tensor],
                chunk: int = 8192) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """The int32 codes ``[N, K/16]`` and fp16 scales ``[N, G_pad]`` of PQ2_0 rows, both
    allocated first and filled ``chunk`` rows at a time from ``rows_of(r0, r1)`` (uint8
    ``[r1 - r0, G*34]``), so that no full-size temporary exists: the load peak stays one
    chunk above the planes and the caching allocator is left without weight-sized holes.
    The third value says whether the codes hold no 3 (one host sync, after the last chunk);
    such planes are recorded (:func:`note_ternary_plane`)."""
    codes = torch.empty(n, groups * 8, dtype=torch.int32, device=device)
    scales = torch.zeros(n, _round_up(groups, _SCALE_ALIGN), dtype=torch.float16, device=device)
    has3 = torch.zeros((), dtype=torch.bool, device=device)
    for r0 in range(0, n, chunk):
        r1 = min(n, r0 + chunk)
        blocks = rows_of(r0, r1).reshape(r1 - r0, groups, PQ2_BLOCK_BYTES)
        scales[r0:r1, :groups] = blocks[..., :2].contiguous().view(torch.float16).reshape(
            r1 - r0, groups)
        code_bytes = _transpose_fields(blocks[..., 2:].reshape(r1 - r0, groups * 32))
        codes[r0:r1] = code_bytes.contiguous().view(torch.int32).reshape(r1 - r0, groups * 8)
        has3 |= _has_code3(codes[r0:r1])
    ternary = not bool(has3)
    if ternary:
        note_ternary_plane(codes)
    return codes, scales, ternary


def _scale_plane(d: torch.Tensor) -> torch.Tensor:
    """fp16 [N, G] -> fp16 [N, G_pad] with a 16-byte aligned row stride."""
    n, g = d.shape
    g_pad = _round_up(g, _SCALE_ALIGN)
    if g_pad == g:
        return d.contiguous()
    out = torch.zeros(n, g_pad, dtype=torch.float16, device=d.device)
    out[:, :g] = d
    return out


@dataclass(eq=False)
class PQ2Weight:
    """A PQ2_0 matrix ``[N, K]`` in the kernels' layout (see the module docstring).

    Build it with :meth:`from_raw` from the GGUF bytes. ``signs`` / ``hadamard_block``
    describe the folded Hadamard rotation of the input, or are both None.
    """

    codes: torch.Tensor
    scales: torch.Tensor
    n: int
    k: int
    signs: torch.Tensor | None = None
    hadamard_block: int | None = None
    fmt: str = field(default="PQ2_0")
    # Whether the codes hold no 3 (None: not known yet, see is_ternary).
    ternary: bool | None = field(default=None, repr=False)

    @classmethod
    def from_raw(cls, raw: torch.Tensor, signs: torch.Tensor | None = None,
                 hadamard_block: int | None = None,
                 device: torch.device | str | None = None) -> PQ2Weight:
        """Prepare uint8 ``[N, K/128*34]`` GGUF rows (optionally moving them to ``device``)."""
        n, g = _check_raw(raw, PQ2_BLOCK_BYTES, "PQ2_0")
        k = g * GROUP
        if device is not None:
            raw = raw.to(device)
        signs, block = _check_transform(k, signs, hadamard_block, raw.device)
        codes, scales, ternary = _pq2_planes(n, g, raw.device, lambda r0, r1: raw[r0:r1])
        return cls(codes=codes, scales=scales, n=n, k=k, signs=signs, hadamard_block=block,
                   ternary=ternary)

    @classmethod
    def from_ptq1_raw(cls, raw: torch.Tensor, signs: torch.Tensor | None = None,
                      hadamard_block: int | None = None, chunk_rows: int = 8192) -> PQ2Weight:
        """The planes of uint8 PTQ1_0 rows ``[N, K/128*28]`` (a lossless transcode, a chunk of
        rows at a time: no PTQ1 or PQ2 copy of the whole matrix is made)."""
        n, g = _check_raw(raw, PTQ1_BLOCK_BYTES, "PTQ1_0")
        k = g * GROUP
        signs, block = _check_transform(k, signs, hadamard_block, raw.device)
        codes, scales, ternary = _pq2_planes(
            n, g, raw.device, lambda r0, r1: _ptq1_rows_as_pq2(raw[r0:r1]), chunk_rows)
        return cls(codes=codes, scales=scales, n=n, k=k, signs=signs, hadamard_block=block,
                   ternary=ternary)

    @classmethod
    def of_planes(cls, codes: torch.Tensor, scales: torch.Tensor,
                  signs: torch.Tensor | None, hadamard_block: int | None) -> PQ2Weight:
        """A view of planes made by :meth:`from_raw` (no checks, no copies): how the
        registered op rebuilds the weight from the tensors a layer holds."""
        return cls(codes=codes, scales=scales, n=codes.shape[0], k=codes.shape[1] * 16,
                   signs=signs, hadamard_block=hadamard_block if signs is not None else None)

    @property
    def device(self) -> torch.device:
        return self.codes.device

    @property
    def groups(self) -> int:
        return self.k // GROUP

    @property
    def nbytes(self) -> int:
        """Bytes a kernel streams per pass (codes plus the unpadded scales)."""
        return self.n * self.k // 4 + self.n * self.groups * 2

    def is_ternary(self) -> bool:
        """Whether the codes are known to hold no 3: checked when the planes were prepared,
        else looked up among the recorded planes (a view made by :meth:`of_planes`)."""
        if self.ternary is None:
            self.ternary = is_ternary_plane(self.codes)
        return self.ternary

    def unpack(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(q int8 [N, K] in -1..2, d fp16 [N, K/128]): the exact integer content."""
        e = torch.arange(16, device=self.device)
        shifts = (8 * (e % 4) + 2 * (e // 4)).to(torch.int32)  # element e = 4q + b
        codes = (self.codes.unsqueeze(-1) >> shifts) & 3
        q = codes.reshape(self.n, self.k).to(torch.int8) - 1
        return q, self.scales[:, :self.groups]

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Dense ``W_st`` [N, K] (one rounding to ``dtype``): for references and fallbacks."""
        q, d = self.unpack()
        w = q.reshape(self.n, self.groups, GROUP).float() * d.float().unsqueeze(-1)
        return w.reshape(self.n, self.k).to(dtype)

    def to_raw(self) -> torch.Tensor:
        """The GGUF bytes again, uint8 [N, K/128*34]."""
        d = self.scales[:, :self.groups].contiguous().view(torch.uint8)
        d = d.reshape(self.n, self.groups, 2)
        codes = _transpose_rows(self.codes.contiguous().view(torch.uint8).reshape(self.n, -1))
        codes = codes.reshape(self.n, self.groups, 32)
        return torch.cat([d, codes], dim=-1).reshape(self.n, self.groups * PQ2_BLOCK_BYTES)


@dataclass(eq=False)
class PTQ1Weight:
    """A PTQ1_0 matrix ``[N, K]`` in the kernels' layout (see the module docstring)."""

    qs: torch.Tensor
    qh: torch.Tensor
    scales: torch.Tensor
    n: int
    k: int
    signs: torch.Tensor | None = None
    hadamard_block: int | None = None
    fmt: str = field(default="PTQ1_0")
    _pq2: PQ2Weight | None = field(default=None, repr=False)

    @classmethod
    def from_raw(cls, raw: torch.Tensor, signs: torch.Tensor | None = None,
                 hadamard_block: int | None = None,
                 device: torch.device | str | None = None) -> PTQ1Weight:
        """Prepare uint8 ``[N, K/128*28]`` GGUF rows."""
        n, g = _check_raw(raw, PTQ1_BLOCK_BYTES, "PTQ1_0")
        k = g * GROUP
        if device is not None:
            raw = raw.to(device)
        signs, block = _check_transform(k, signs, hadamard_block, raw.device)
        blocks = raw.reshape(n, g, PTQ1_BLOCK_BYTES)
        qs = _packed(blocks[..., :24]).view(torch.int32).reshape(n, g * 6)
        qh = blocks[..., 24:26].contiguous().reshape(n, g * 2)
        d = _packed(blocks[..., 26:]).view(torch.float16).reshape(n, g)
        return cls(qs=qs, qh=qh, scales=_scale_plane(d), n=n, k=k, signs=signs,
                   hadamard_block=block)

    @property
    def device(self) -> torch.device:
        return self.qs.device

    @property
    def groups(self) -> int:
        return self.k // GROUP

    @property
    def nbytes(self) -> int:
        return self.n * self.groups * PTQ1_BLOCK_BYTES

    def to_raw(self, rows: slice | None = None) -> torch.Tensor:
        """The GGUF bytes again, uint8 [N, K/128*28] (or the given rows)."""
        rows = rows or slice(None)
        g = self.groups
        qs = self.qs[rows].contiguous().view(torch.uint8)
        n = qs.shape[0]
        qs = qs.reshape(n, g, 24)
        qh = self.qh[rows].reshape(n, g, 2)
        d = self.scales[rows, :g].contiguous().view(torch.uint8).reshape(n, g, 2)
        return torch.cat([qs, qh, d], dim=-1).reshape(n, g * PTQ1_BLOCK_BYTES)

    def unpack(self, rows: slice | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(q int8 [N, K] in -1..1, d fp16 [N, K/128]) through the reference codec."""
        return codecs_torch.unpack_blocks(self.to_raw(rows), GGMLType.PTQ1_0)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Dense ``W_st`` [N, K]: for references and fallbacks."""
        return codecs_torch.dequantize_to(self.to_raw(), GGMLType.PTQ1_0, dtype)

    def as_pq2(self, chunk_rows: int = 16384) -> PQ2Weight:
        """The same values as a :class:`PQ2Weight` (lossless transcode, made once, cached).

        The small-batch and prefill kernels read PQ2 planes; this copy costs 34/28 of the
        PTQ1 bytes on the device.
        """
        if self._pq2 is None:
            codes, scales, ternary = _pq2_planes(
                self.n, self.groups, self.device,
                lambda r0, r1: _ptq1_rows_as_pq2(self.to_raw(slice(r0, r1))), chunk_rows)
            self._pq2 = PQ2Weight(codes=codes, scales=scales, n=self.n, k=self.k,
                                  signs=self.signs, hadamard_block=self.hadamard_block,
                                  ternary=ternary)
        return self._pq2
