"""A small GGUF v2/v3 writer for test fixtures and ``make-tiny`` models.

It writes every metadata value type (with explicit types where llama.cpp checks them
strictly, e.g. hyperparameters as UINT32 and norm epsilons as FLOAT32) and every
tensor type vllm-prism knows, including the non-upstream PQ2_0 / PTQ1_0 and both
Q2_0 group sizes. Float tensors are given as float arrays; block tensors as their raw
bytes (``uint8``) together with their logical shape.

A file is reproducible from a :class:`~vllm_prism.gguf.reader.GGUFReader`::

    for key, value in reader.metadata.items():
        writer.add_metadata(key, value, reader.metadata_types[key])
"""

from __future__ import annotations

import math
import os
import struct
from collections.abc import Sequence
from typing import Any, BinaryIO

import numpy as np

from vllm_prism.gguf.constants import (
    GGML_BLOCK_LAYOUTS,
    GGUF_ALIGNMENT_KEY,
    GGUF_DEFAULT_ALIGNMENT,
    GGUF_MAGIC,
    GGUF_SUPPORTED_VERSIONS,
    Q2_0_G64_LAYOUT,
    BlockLayout,
    GGMLType,
    GGUFValueType,
)
from vllm_prism.gguf.errors import GGUFError
from vllm_prism.gguf.floats import bf16_bits_from_float32
from vllm_prism.gguf.reader import MAX_ARRAY_NESTING, MAX_N_DIMS, MetadataType

__all__ = ["GGUFWriter"]

_INT_RANGES: dict[GGUFValueType, tuple[int, int]] = {
    GGUFValueType.UINT8: (0, 2**8 - 1),
    GGUFValueType.INT8: (-(2**7), 2**7 - 1),
    GGUFValueType.UINT16: (0, 2**16 - 1),
    GGUFValueType.INT16: (-(2**15), 2**15 - 1),
    GGUFValueType.UINT32: (0, 2**32 - 1),
    GGUFValueType.INT32: (-(2**31), 2**31 - 1),
    GGUFValueType.UINT64: (0, 2**64 - 1),
    GGUFValueType.INT64: (-(2**63), 2**63 - 1),
}
_SCALAR_DTYPES: dict[GGUFValueType, str] = {
    GGUFValueType.UINT8: "<u1",
    GGUFValueType.INT8: "<i1",
    GGUFValueType.UINT16: "<u2",
    GGUFValueType.INT16: "<i2",
    GGUFValueType.UINT32: "<u4",
    GGUFValueType.INT32: "<i4",
    GGUFValueType.FLOAT32: "<f4",
    GGUFValueType.BOOL: "<u1",
    GGUFValueType.UINT64: "<u8",
    GGUFValueType.INT64: "<i8",
    GGUFValueType.FLOAT64: "<f8",
}
_FLOAT_TYPES = (GGUFValueType.FLOAT32, GGUFValueType.FLOAT64)


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _is_float(value: Any) -> bool:
    return isinstance(value, (float, np.floating))


def _is_bool(value: Any) -> bool:
    return isinstance(value, (bool, np.bool_))


def _is_sequence(value: Any) -> bool:
    if isinstance(value, np.ndarray):
        return value.ndim > 0
    return isinstance(value, (list, tuple))


def _int_type_for(values: Sequence[int]) -> GGUFValueType:
    lo, hi = min(values), max(values)
    for vtype in (GGUFValueType.INT32, GGUFValueType.INT64, GGUFValueType.UINT64):
        tlo, thi = _INT_RANGES[vtype]
        if tlo <= lo and hi <= thi:
            return vtype
    raise ValueError(f"integer {lo if lo < 0 else hi} does not fit in 64 bits")


class _TypeInference:
    """Infers a MetadataType from python values (see GGUFWriter.add_metadata)."""

    @classmethod
    def scalar(cls, values: Sequence[Any]) -> GGUFValueType:
        if all(_is_bool(v) for v in values):
            return GGUFValueType.BOOL
        if all(_is_int(v) for v in values):
            return _int_type_for(values)
        if all(_is_int(v) or _is_float(v) for v in values):
            return GGUFValueType.FLOAT32
        if all(isinstance(v, str) for v in values):
            return GGUFValueType.STRING
        kinds = sorted({type(v).__name__ for v in values})
        raise ValueError(f"cannot infer one GGUF type for values of types {kinds}")

    @classmethod
    def array_element(cls, value: Sequence[Any]) -> tuple:
        """Type tuple tail (after the leading ARRAY) for a list value."""
        tail: list[GGUFValueType] = []
        level = list(value)
        while level and all(_is_sequence(v) for v in level):
            tail.append(GGUFValueType.ARRAY)
            level = [x for v in level for x in v]
        if not level:
            raise ValueError("cannot infer the element type of an empty array; "
                             "pass element_type")
        if any(_is_sequence(v) for v in level):
            raise ValueError("array mixes nested arrays and scalars")
        return (*tail, cls.scalar(level))


class GGUFWriter:
    """Collects metadata and tensors, then writes a GGUF file with :meth:`write`."""

    def __init__(self, path: str | os.PathLike, *, version: int = 3,
                 alignment: int = GGUF_DEFAULT_ALIGNMENT) -> None:
        self.path = os.fspath(path)
        if version not in GGUF_SUPPORTED_VERSIONS:
            raise GGUFError(f"cannot write GGUF version {version}; vllm-prism writes "
                            f"versions 2 and 3", self.path)
        if alignment <= 0 or alignment & (alignment - 1):
            raise GGUFError(f"alignment {alignment} is not a positive power of two",
                            self.path)
        self.version = version
        self.alignment = alignment
        self._kv: dict[str, tuple[Any, MetadataType]] = {}
        self._tensors: dict[str, tuple[tuple[int, ...], GGMLType, np.ndarray]] = {}

    def _error(self, message: str) -> GGUFError:
        return GGUFError(message, self.path)

    # ------------------------------------------------------------------ metadata

    def add_metadata(self, key: str, value: Any,
                     value_type: MetadataType | None = None,
                     element_type: MetadataType | None = None) -> None:
        """Add one key/value pair.

        ``value_type`` may be a GGUFValueType or a full type tuple as found in
        ``GGUFReader.metadata_types``. For ``value_type=ARRAY``, ``element_type``
        gives the element type (a GGUFValueType or a type tuple for nested arrays).
        Without explicit types: bool -> BOOL, int -> INT32 if it fits else INT64
        (UINT64 above the int64 range), float -> FLOAT32, str -> STRING, and
        list/tuple/ndarray -> ARRAY with the element type inferred from all the
        elements the same way (nested lists -> ARRAY of ARRAY).
        """
        if not isinstance(key, str):
            raise self._error(f"metadata key {key!r} is not a string")
        if key in self._kv:
            raise self._error(f"duplicate metadata key '{key}'")
        try:
            desc = self._resolve_type(value, value_type, element_type)
            self._check_value(value, desc, depth=0)
        except ValueError as e:
            raise self._error(f"metadata key '{key}': {e}") from None
        if key == GGUF_ALIGNMENT_KEY and not (
                isinstance(desc, GGUFValueType) and desc in _INT_RANGES):
            raise self._error(f"metadata key '{GGUF_ALIGNMENT_KEY}' must be an unsigned "
                              f"integer (UINT32); pass alignment= to GGUFWriter")
        if key == GGUF_ALIGNMENT_KEY and value != self.alignment:
            raise self._error(
                f"metadata key '{GGUF_ALIGNMENT_KEY}' = {value} disagrees with the "
                f"writer's alignment {self.alignment}; pass alignment= to GGUFWriter")
        self._kv[key] = (value, desc)

    @staticmethod
    def _resolve_type(value: Any, value_type: MetadataType | None,
                      element_type: MetadataType | None) -> MetadataType:
        if isinstance(value_type, tuple):
            return value_type
        if value_type is None:
            if element_type is not None and not _is_sequence(value):
                raise ValueError("element_type given for a non-array value")
            if _is_sequence(value):
                value_type = GGUFValueType.ARRAY
            else:
                return _TypeInference.scalar([value])
        value_type = GGUFValueType(value_type)
        if value_type != GGUFValueType.ARRAY:
            if element_type is not None:
                raise ValueError(f"element_type given for a {value_type.name} value")
            return value_type
        if element_type is None:
            if not _is_sequence(value):
                raise ValueError(f"ARRAY value must be a list, got {type(value).__name__}")
            return (GGUFValueType.ARRAY, *_TypeInference.array_element(value))
        if isinstance(element_type, tuple):
            return (GGUFValueType.ARRAY, *element_type)
        element_type = GGUFValueType(element_type)
        if element_type == GGUFValueType.ARRAY:
            # Inner types inferred from the inner values.
            if not _is_sequence(value):
                raise ValueError(f"ARRAY value must be a list, got {type(value).__name__}")
            if len(value) == 0:
                return (GGUFValueType.ARRAY, GGUFValueType.ARRAY)
            tail = _TypeInference.array_element(value)
            if tail[0] != GGUFValueType.ARRAY:
                raise ValueError("element_type is ARRAY but the elements are not lists")
            return (GGUFValueType.ARRAY, *tail)
        return (GGUFValueType.ARRAY, element_type)

    @staticmethod
    def _element_type(desc: tuple) -> MetadataType | list | None:
        """Element type of an array type tuple; None for an unknown inner type."""
        if len(desc) < 2:
            raise ValueError(f"array type {desc} lacks an element type")
        rest = desc[1:]
        if GGUFValueType(rest[0]) != GGUFValueType.ARRAY:
            if len(rest) != 1:
                raise ValueError(f"malformed array type {desc}")
            return GGUFValueType(rest[0])
        if len(rest) == 1:
            return None
        if isinstance(rest[1], list):
            if len(rest) != 2:
                raise ValueError(f"malformed array type {desc}")
            return rest[1]
        return tuple(rest)

    def _check_value(self, value: Any, desc: MetadataType, depth: int) -> None:
        """Raise ValueError when ``value`` cannot be written as ``desc``."""
        if isinstance(desc, tuple):
            if depth >= MAX_ARRAY_NESTING:
                raise ValueError(f"arrays nested deeper than {MAX_ARRAY_NESTING}")
            if GGUFValueType(desc[0]) != GGUFValueType.ARRAY:
                raise ValueError(f"malformed type {desc}")
            if not _is_sequence(value):
                raise ValueError(f"expected a list for type {desc}, got "
                                 f"{type(value).__name__}")
            elem = self._element_type(desc)
            if isinstance(elem, list):
                if len(elem) != len(value):
                    raise ValueError(f"{len(elem)} element types for {len(value)} "
                                     f"elements")
                for v, d in zip(value, elem, strict=True):
                    self._check_value(v, d, depth + 1)
                return
            if elem is None:
                if len(value):
                    raise ValueError(f"type {desc} has no inner element type for a "
                                     f"non-empty array")
                return
            if isinstance(elem, GGUFValueType) and elem in _INT_RANGES and len(value):
                self._check_ints(value, elem)
                return
            for v in value:
                self._check_value(v, elem, depth + 1)
            return
        vtype = GGUFValueType(desc)
        if vtype == GGUFValueType.ARRAY:
            raise ValueError("ARRAY type without an element type")
        if vtype in _INT_RANGES:
            self._check_ints([value], vtype)
        elif vtype in _FLOAT_TYPES:
            if not (_is_int(value) or _is_float(value)):
                raise ValueError(f"expected a number for {vtype.name}, got {value!r}")
        elif vtype == GGUFValueType.BOOL:
            if not (_is_bool(value) or (_is_int(value) and value in (0, 1))):
                raise ValueError(f"expected a bool, got {value!r}")
        elif vtype == GGUFValueType.STRING:
            if not isinstance(value, str):
                raise ValueError(f"expected a str, got {type(value).__name__}")
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as e:
                raise ValueError(f"string {value!r} cannot be encoded as UTF-8: "
                                 f"{e.reason}") from None

    @staticmethod
    def _check_ints(values: Sequence[Any], vtype: GGUFValueType) -> None:
        lo, hi = _INT_RANGES[vtype]
        if isinstance(values, np.ndarray) and values.dtype.kind in "iu":
            if values.size and not (lo <= int(values.min()) and int(values.max()) <= hi):
                raise ValueError(f"values {int(values.min())}..{int(values.max())} are "
                                 f"out of range for {vtype.name}")
            return
        for v in values:
            if not _is_int(v):
                raise ValueError(f"expected an integer for {vtype.name}, got {v!r}")
            if not lo <= int(v) <= hi:
                raise ValueError(f"{int(v)} is out of range for {vtype.name}")

    # ------------------------------------------------------------------ tensors

    def add_tensor(self, name: str, data: np.ndarray, ggml_type: GGMLType,
                   shape: Sequence[int] | None = None, *,
                   q2_0_group: int = 128) -> None:
        """Add a tensor.

        Float types take float arrays (F32, F16; BF16 also takes uint16 bits, float
        data is rounded to nearest even); ``shape`` defaults to ``data.shape``. Block
        types take the raw bytes (uint8, any shape) and require ``shape`` in numpy
        order (last = elements per row); ``q2_0_group`` (64 or 128) picks the Q2_0
        layout.
        """
        if name in self._tensors:
            raise self._error(f"duplicate tensor name '{name}'")
        try:
            ggml_type = GGMLType(ggml_type)
        except ValueError:
            raise self._error(f"tensor '{name}': unknown tensor type {ggml_type}"
                              ) from None
        data = np.asarray(data)
        if ggml_type in (GGMLType.F32, GGMLType.F16, GGMLType.BF16):
            shape = tuple(data.shape) if shape is None else tuple(int(s) for s in shape)
            payload = self._float_payload(name, data, ggml_type)
            if math.prod(shape) != payload.size:
                raise self._error(f"tensor '{name}': shape {shape} does not match "
                                  f"{payload.size} elements of data")
        else:
            if shape is None:
                raise self._error(f"tensor '{name}': block type {ggml_type.name} "
                                  f"needs shape= (numpy order)")
            shape = tuple(int(s) for s in shape)
            payload = self._block_payload(name, data, ggml_type, shape, q2_0_group)
        self._check_shape(name, shape)
        self._tensors[name] = (tuple(reversed(shape)), ggml_type, payload)

    def _check_shape(self, name: str, shape: tuple[int, ...]) -> None:
        if not 1 <= len(shape) <= MAX_N_DIMS:
            raise self._error(f"tensor '{name}': shape {shape} must have 1 to "
                              f"{MAX_N_DIMS} dimensions")
        if any(s <= 0 for s in shape):
            raise self._error(f"tensor '{name}': every dimension of shape {shape} "
                              f"must be positive")

    def _float_payload(self, name: str, data: np.ndarray,
                       ggml_type: GGMLType) -> np.ndarray:
        if ggml_type == GGMLType.BF16 and data.dtype == np.uint16:
            return np.ascontiguousarray(data, dtype="<u2").reshape(-1)
        if data.dtype.kind not in "fiu":
            raise self._error(f"tensor '{name}': {ggml_type.name} needs float data, "
                              f"got dtype {data.dtype}")
        if ggml_type == GGMLType.BF16:
            return bf16_bits_from_float32(data.astype(np.float32)).reshape(-1)
        dtype = "<f4" if ggml_type == GGMLType.F32 else "<f2"
        return np.ascontiguousarray(data, dtype=dtype).reshape(-1)

    def _block_payload(self, name: str, data: np.ndarray, ggml_type: GGMLType,
                       shape: tuple[int, ...], q2_0_group: int) -> np.ndarray:
        if data.dtype != np.uint8:
            raise self._error(f"tensor '{name}': block type {ggml_type.name} takes "
                              f"raw bytes (uint8), got dtype {data.dtype}")
        layout = self._block_layout(name, ggml_type, q2_0_group)
        if not shape or shape[-1] % layout.block_size:
            raise self._error(
                f"tensor '{name}': row length {shape[-1] if shape else None} is not a "
                f"multiple of the {ggml_type.name} block size {layout.block_size}")
        expected = math.prod(shape) // layout.block_size * layout.type_size
        if data.nbytes != expected:
            raise self._error(
                f"tensor '{name}': {ggml_type.name} (group {layout.block_size}) of "
                f"shape {shape} takes {expected} bytes, got {data.nbytes}")
        return np.ascontiguousarray(data).reshape(-1)

    def _block_layout(self, name: str, ggml_type: GGMLType,
                      q2_0_group: int) -> BlockLayout:
        if ggml_type != GGMLType.Q2_0:
            return GGML_BLOCK_LAYOUTS[ggml_type]
        if q2_0_group == 128:
            return GGML_BLOCK_LAYOUTS[GGMLType.Q2_0]
        if q2_0_group == 64:
            return Q2_0_G64_LAYOUT
        raise self._error(f"tensor '{name}': q2_0_group must be 64 or 128, got "
                          f"{q2_0_group}")

    # ------------------------------------------------------------------ output

    def write(self) -> None:
        """Write the header, key/value pairs, tensor infos and aligned data."""
        kv = dict(self._kv)
        if self.alignment != GGUF_DEFAULT_ALIGNMENT and GGUF_ALIGNMENT_KEY not in kv:
            kv[GGUF_ALIGNMENT_KEY] = (self.alignment, GGUFValueType.UINT32)
        header = bytearray()
        header += GGUF_MAGIC
        header += struct.pack("<IQQ", self.version, len(self._tensors), len(kv))
        for key, (value, desc) in kv.items():
            header += self._pack_string(key)
            header += self._pack_value(value, desc)
        offset = 0
        for name, (ne, ggml_type, payload) in self._tensors.items():
            header += self._pack_string(name)
            header += struct.pack(f"<I{len(ne)}QIQ", len(ne), *ne, int(ggml_type),
                                  offset)
            offset += self._padded(payload.nbytes)
        header += bytes(self._padded(len(header)) - len(header))
        try:
            with open(self.path, "wb") as f:
                f.write(header)
                self._write_data(f)
        except OSError as e:
            raise self._error(f"cannot write the file: {e.strerror or e}") from None

    def _write_data(self, f: BinaryIO) -> None:
        for _, _, payload in self._tensors.values():
            f.write(memoryview(payload).cast("B"))
            f.write(bytes(self._padded(payload.nbytes) - payload.nbytes))

    def _padded(self, n: int) -> int:
        return (n + self.alignment - 1) // self.alignment * self.alignment

    @staticmethod
    def _pack_string(text: str) -> bytes:
        data = text.encode("utf-8")
        return struct.pack("<Q", len(data)) + data

    def _pack_value(self, value: Any, desc: MetadataType) -> bytes:
        if isinstance(desc, tuple):
            return self._pack_array(value, desc)
        vtype = GGUFValueType(desc)
        out = struct.pack("<I", int(vtype))
        return out + self._pack_payload(value, vtype)

    def _pack_payload(self, value: Any, vtype: GGUFValueType) -> bytes:
        if vtype == GGUFValueType.STRING:
            return self._pack_string(value)
        if vtype == GGUFValueType.BOOL:
            return struct.pack("<B", 1 if value else 0)
        return np.array(value, dtype=_SCALAR_DTYPES[vtype]).tobytes()

    def _pack_array(self, value: Sequence[Any], desc: tuple) -> bytes:
        elem = self._element_type(desc)
        etype = GGUFValueType.ARRAY if elem is None or not isinstance(
            elem, GGUFValueType) else elem
        out = bytearray(struct.pack("<IIQ", int(GGUFValueType.ARRAY), int(etype),
                                    len(value)))
        if isinstance(elem, list):
            for v, d in zip(value, elem, strict=True):
                out += self._pack_array(v, d)[4:]  # drop the inner type tag
        elif isinstance(elem, tuple):
            for v in value:
                out += self._pack_array(v, elem)[4:]
        elif etype == GGUFValueType.STRING:
            for v in value:
                out += self._pack_string(v)
        elif etype == GGUFValueType.BOOL:
            out += bytes(1 if v else 0 for v in value)
        elif etype != GGUFValueType.ARRAY and len(value):
            out += np.asarray(value, dtype=_SCALAR_DTYPES[etype]).tobytes()
        return bytes(out)
