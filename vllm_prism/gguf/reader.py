"""A strict, zero-copy GGUF reader (versions 2 and 3) in numpy only.

gguf-py refuses tensor types it does not know (such as PQ2_0 = 142 and PTQ1_0 = 143),
so vllm-prism parses GGUF itself. :class:`GGUFReader` memory-maps the file read-only,
parses and validates the whole header eagerly (metadata, tensor infos, offsets, sizes,
overlaps) and hands out tensor data as numpy views of the mapping, without copying.

Every problem with a file raises :class:`~vllm_prism.gguf.errors.GGUFError` naming the
file and the exact problem. Counts and lengths read from the file are checked against
the bytes left in the file before anything is allocated or looped over, so a crafted
file cannot make the reader allocate gigabytes or hang.

Q2_0 (type 42) exists with group 128 (34 bytes per block, legacy Prism) and group 64
(18 bytes per block, mainline ggml). The reader tells them apart by the space the
tensor occupies in the file (see :meth:`GGUFReader._resolve_q2_0`).
"""

from __future__ import annotations

import math
import mmap
import os
import stat
import struct
from dataclasses import dataclass
from typing import Any

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
from vllm_prism.gguf.floats import bf16_bits_from_float32, float32_from_bf16_bits

__all__ = [
    "GGUFReader",
    "GGUFTensorInfo",
    "MetadataType",
    "bf16_bits_from_float32",
    "float32_from_bf16_bits",
    "MAX_ARRAY_NESTING",
    "MAX_N_DIMS",
    "MAX_ELEMENTS",
]

# A metadata value type: a GGUFValueType for scalars and strings; for arrays a tuple
# (ARRAY, element type, ...): (ARRAY, UINT32) is an array of UINT32, (ARRAY, ARRAY,
# INT32) an array of arrays of INT32, (ARRAY, ARRAY) an empty array of arrays. When
# the inner arrays of an array of arrays have different types, the tuple is
# (ARRAY, ARRAY, [type of element 0, type of element 1, ...]).
MetadataType = GGUFValueType | tuple

MAX_ARRAY_NESTING = 8
MAX_N_DIMS = 4
MAX_ELEMENTS = 2**62

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")

# Fixed-size scalar value types: struct format and numpy dtype (little-endian).
_SCALAR_STRUCTS: dict[GGUFValueType, struct.Struct] = {
    GGUFValueType.UINT8: struct.Struct("<B"),
    GGUFValueType.INT8: struct.Struct("<b"),
    GGUFValueType.UINT16: struct.Struct("<H"),
    GGUFValueType.INT16: struct.Struct("<h"),
    GGUFValueType.UINT32: struct.Struct("<I"),
    GGUFValueType.INT32: struct.Struct("<i"),
    GGUFValueType.FLOAT32: struct.Struct("<f"),
    GGUFValueType.BOOL: struct.Struct("<B"),
    GGUFValueType.UINT64: struct.Struct("<Q"),
    GGUFValueType.INT64: struct.Struct("<q"),
    GGUFValueType.FLOAT64: struct.Struct("<d"),
}
_SCALAR_DTYPES: dict[GGUFValueType, np.dtype] = {
    GGUFValueType.UINT8: np.dtype("<u1"),
    GGUFValueType.INT8: np.dtype("<i1"),
    GGUFValueType.UINT16: np.dtype("<u2"),
    GGUFValueType.INT16: np.dtype("<i2"),
    GGUFValueType.UINT32: np.dtype("<u4"),
    GGUFValueType.INT32: np.dtype("<i4"),
    GGUFValueType.FLOAT32: np.dtype("<f4"),
    GGUFValueType.BOOL: np.dtype("<u1"),
    GGUFValueType.UINT64: np.dtype("<u8"),
    GGUFValueType.INT64: np.dtype("<i8"),
    GGUFValueType.FLOAT64: np.dtype("<f8"),
}
# Smallest possible encoded size of one value of each type (used to refuse counts
# that could not fit in the rest of the file before looping over them).
_MIN_VALUE_BYTES: dict[GGUFValueType, int] = {
    **{t: s.size for t, s in _SCALAR_STRUCTS.items()},
    GGUFValueType.STRING: 8,  # u64 length
    GGUFValueType.ARRAY: 4 + 8,  # u32 element type + u64 count
}
_MIN_KV_BYTES = 8 + 4 + 1  # key length, value type, smallest value
_MIN_TENSOR_INFO_BYTES = 8 + 4 + 8 + 4 + 8  # name length, n_dims, one ne, type, offset
_FLOAT_VALUE_TYPES = frozenset({GGUFValueType.FLOAT32, GGUFValueType.FLOAT64})
_INT_VALUE_TYPES = frozenset(
    set(_SCALAR_STRUCTS) - _FLOAT_VALUE_TYPES - {GGUFValueType.BOOL})

# numpy dtype of tensor() for the float tensor types; block types are raw bytes.
_TENSOR_DTYPES: dict[GGMLType, np.dtype] = {
    GGMLType.F32: np.dtype("<f4"),
    GGMLType.F16: np.dtype("<f2"),
    GGMLType.BF16: np.dtype("<u2"),
}


def _supported_types_text() -> str:
    return ", ".join(f"{t.name} ({t.value})" for t in GGMLType)


def _align_up(n: int, alignment: int) -> int:
    return (n + alignment - 1) // alignment * alignment


@dataclass(frozen=True)
class GGUFTensorInfo:
    """Where and how one tensor is stored in a GGUF file."""

    name: str
    ne: tuple[int, ...]  # ggml order: ne[0] is the innermost (input) dimension
    ggml_type: GGMLType
    offset: int  # absolute byte offset of the data in the file
    nbytes: int
    layout: BlockLayout  # resolved (for Q2_0: group 128 or Q2_0_G64_LAYOUT)

    @property
    def shape(self) -> tuple[int, ...]:
        """numpy/torch order: reversed ``ne``."""
        return tuple(reversed(self.ne))

    @property
    def n_elements(self) -> int:
        return math.prod(self.ne)

    @property
    def row_bytes(self) -> int:
        """Bytes of one row (``ne[0]`` elements)."""
        return self.ne[0] // self.layout.block_size * self.layout.type_size


class _HeaderParser:
    """Sequential little-endian reads from the mapped file with bounds checks."""

    def __init__(self, buf: mmap.mmap, size: int, path: str) -> None:
        self.buf = buf
        self.size = size
        self.path = path
        self.pos = 0

    def error(self, message: str) -> GGUFError:
        return GGUFError(message, self.path)

    @property
    def remaining(self) -> int:
        return self.size - self.pos

    def need(self, n: int, what: str) -> None:
        if n > self.size - self.pos:
            raise self.error(
                f"truncated header: reading {what} at offset {self.pos} needs {n} "
                f"bytes but the file ends at {self.size}; the file is incomplete or "
                f"corrupt, download it again")

    def bytes(self, n: int, what: str) -> bytes:
        self.need(n, what)
        data = self.buf[self.pos:self.pos + n]
        self.pos += n
        return data

    def u32(self, what: str) -> int:
        self.need(4, what)
        (value,) = _U32.unpack_from(self.buf, self.pos)
        self.pos += 4
        return value

    def u64(self, what: str) -> int:
        self.need(8, what)
        (value,) = _U64.unpack_from(self.buf, self.pos)
        self.pos += 8
        return value

    def check_count(self, count: int, min_bytes: int, what: str, at: int) -> None:
        """Refuse a count whose items could not fit in the rest of the file."""
        if count * min_bytes > self.remaining:
            raise self.error(
                f"implausible {what}: {count} (read at offset {at}) items need at "
                f"least {count * min_bytes} bytes but only {self.remaining} bytes "
                f"remain in the file (corrupt or truncated header)")

    def string(self, what: str) -> str:
        at = self.pos
        length = self.u64(f"the length of {what}")
        if length > self.remaining:
            raise self.error(
                f"implausible string length {length} for {what} at offset {at}: only "
                f"{self.remaining} bytes remain in the file (corrupt or truncated "
                f"header)")
        data = self.buf[self.pos:self.pos + length]
        self.pos += length
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise self.error(
                f"{what} at offset {at} is not valid UTF-8 ({e.reason} at byte "
                f"{e.start} of the string)") from None

    def value_type(self, what: str) -> GGUFValueType:
        at = self.pos
        raw = self.u32(what)
        try:
            return GGUFValueType(raw)
        except ValueError:
            known = ", ".join(f"{t.name} ({t.value})" for t in GGUFValueType)
            raise self.error(
                f"unknown metadata value type {raw} for {what} at offset {at}; "
                f"known types: {known}") from None

    def value(self, vtype: GGUFValueType, key: str) -> tuple[Any, MetadataType]:
        if vtype == GGUFValueType.ARRAY:
            return self.array(key, depth=1)
        if vtype == GGUFValueType.STRING:
            return self.string(f"the string value of key '{key}'"), vtype
        fmt = _SCALAR_STRUCTS[vtype]
        self.need(fmt.size, f"the {vtype.name} value of key '{key}'")
        (value,) = fmt.unpack_from(self.buf, self.pos)
        self.pos += fmt.size
        if vtype == GGUFValueType.BOOL:
            value = bool(value)
        return value, vtype

    def array(self, key: str, depth: int) -> tuple[list, MetadataType]:
        at = self.pos
        if depth > MAX_ARRAY_NESTING:
            raise self.error(
                f"metadata key '{key}': arrays nested {depth} deep at offset {at}; "
                f"vllm-prism accepts at most {MAX_ARRAY_NESTING} levels of nesting")
        etype = self.value_type(f"the array element type of key '{key}'")
        count_at = self.pos
        count = self.u64(f"the array length of key '{key}'")
        self.check_count(count, _MIN_VALUE_BYTES[etype],
                         f"array length of key '{key}'", count_at)
        if etype in _SCALAR_DTYPES:
            return self.numeric_array(etype, count), (GGUFValueType.ARRAY, etype)
        if etype == GGUFValueType.STRING:
            return self.string_array(key, count), (GGUFValueType.ARRAY, etype)
        values, descs = [], []
        for _ in range(count):
            inner, desc = self.array(key, depth + 1)
            values.append(inner)
            descs.append(desc)
        return values, _nested_array_type(descs)

    def numeric_array(self, etype: GGUFValueType, count: int) -> list:
        if count == 0:
            return []
        dtype = _SCALAR_DTYPES[etype]
        arr = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.pos)
        self.pos += count * dtype.itemsize
        if etype == GGUFValueType.BOOL:
            arr = arr != 0
        values = arr.tolist()
        del arr  # release the buffer export so the mmap can be closed
        return values

    def string_array(self, key: str, count: int) -> list[str]:
        buf, size, unpack = self.buf, self.size, _U64.unpack_from
        pos = self.pos
        out: list[str] = []
        append = out.append
        for i in range(count):
            if size - pos < 8:
                self.pos = pos
                self.need(8, f"the length of string {i} of array '{key}'")
            (length,) = unpack(buf, pos)
            pos += 8
            if length > size - pos:
                raise self.error(
                    f"implausible string length {length} for string {i} of array "
                    f"'{key}' at offset {pos - 8}: only {size - pos} bytes remain in "
                    f"the file (corrupt or truncated header)")
            data = buf[pos:pos + length]
            try:
                append(data.decode("utf-8"))
            except UnicodeDecodeError as e:
                raise self.error(
                    f"string {i} of array '{key}' at offset {pos - 8} is not valid "
                    f"UTF-8 ({e.reason} at byte {e.start} of the string)") from None
            pos += length
        self.pos = pos
        return out


def _nested_array_type(descs: list[MetadataType]) -> MetadataType:
    """The type tuple of an array whose elements are arrays of types ``descs``."""
    if not descs:
        return (GGUFValueType.ARRAY, GGUFValueType.ARRAY)
    first = descs[0]
    if all(d == first for d in descs):
        return (GGUFValueType.ARRAY, *first)
    return (GGUFValueType.ARRAY, GGUFValueType.ARRAY, list(descs))


@dataclass
class _RawTensorInfo:
    name: str
    ne: tuple[int, ...]
    ggml_type: GGMLType
    offset: int  # absolute
    info_offset: int  # where its info starts in the header (for messages)


class GGUFReader:
    """Memory-mapped, eagerly validated GGUF v2/v3 file.

    ``metadata`` maps keys to python values and ``metadata_types`` to their GGUF
    types (see :data:`MetadataType`), both in file order; ``tensors`` maps names to
    :class:`GGUFTensorInfo` in file order. :meth:`raw` and :meth:`tensor` return
    read-only numpy views of the mapping (no copy).
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path: str = os.fspath(path)
        self._mm: mmap.mmap | None = None
        self._mm = self._open(self.path)
        self.file_size: int = len(self._mm)
        self.version: int = 0
        self.alignment: int = GGUF_DEFAULT_ALIGNMENT
        self.data_offset: int = 0
        self.metadata: dict[str, Any] = {}
        self.metadata_types: dict[str, MetadataType] = {}
        self.tensors: dict[str, GGUFTensorInfo] = {}
        try:
            self._parse()
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ opening

    @staticmethod
    def _open(path: str) -> mmap.mmap:
        if os.path.isdir(path):
            raise GGUFError("is a directory, not a GGUF file; pass the path of the "
                            ".gguf file itself", path)
        try:
            mode = os.stat(path).st_mode
        except FileNotFoundError:
            raise GGUFError("no such file; check the model path", path) from None
        except OSError as e:
            raise GGUFError(f"cannot read the file: {e.strerror or e}", path) from None
        if not stat.S_ISREG(mode):  # a FIFO or device would block or never end
            raise GGUFError("is not a regular file (a pipe, socket or device); pass the path "
                            "of a .gguf file", path)
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size == 0:
                    raise GGUFError(
                        "truncated header: the file is empty (0 bytes), expected a "
                        "GGUF header starting with b'GGUF'", path)
                return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except FileNotFoundError:
            raise GGUFError("no such file; check the model path", path) from None
        except OSError as e:
            raise GGUFError(f"cannot open or map the file: {e.strerror or e}",
                            path) from None

    def _error(self, message: str) -> GGUFError:
        return GGUFError(message, self.path)

    # ------------------------------------------------------------------ parsing

    def _parse(self) -> None:
        assert self._mm is not None
        p = _HeaderParser(self._mm, self.file_size, self.path)
        self._parse_preamble(p)
        n_tensors, n_kv = self._parse_counts(p)
        for i in range(n_kv):
            self._parse_kv(p, i)
        self.alignment = self._alignment_from_metadata()
        seen: set[str] = set()
        raw = [self._parse_tensor_info(p, i, seen) for i in range(n_tensors)]
        self.data_offset = _align_up(p.pos, self.alignment)
        for info in raw:
            info.offset += self.data_offset
        self.tensors = self._layout_tensors(raw)

    def _parse_preamble(self, p: _HeaderParser) -> None:
        magic = p.bytes(4, "the magic")
        if magic != GGUF_MAGIC:
            raise self._error(
                f"not a GGUF file: the magic is {magic!r}, expected {GGUF_MAGIC!r}")
        version = p.u32("the GGUF version")
        if version not in GGUF_SUPPORTED_VERSIONS:
            message = (f"unsupported GGUF version {version} (vllm-prism reads "
                       f"versions 2 and 3)")
            if struct.unpack("<I", struct.pack(">I", version))[0] in (
                    GGUF_SUPPORTED_VERSIONS):
                message += "; this looks like a big-endian GGUF file, convert it to " \
                           "little-endian"
            elif version == 1:
                message += "; GGUF v1 is obsolete, re-convert the model with a " \
                           "current llama.cpp"
            raise self._error(message)
        self.version = version

    def _parse_counts(self, p: _HeaderParser) -> tuple[int, int]:
        t_at = p.pos
        n_tensors = p.u64("the tensor count")
        kv_at = p.pos
        n_kv = p.u64("the metadata key/value count")
        p.check_count(n_kv, _MIN_KV_BYTES, "metadata key/value count", kv_at)
        needed = n_kv * _MIN_KV_BYTES + n_tensors * _MIN_TENSOR_INFO_BYTES
        if needed > p.remaining:
            raise self._error(
                f"implausible tensor count {n_tensors} at offset {t_at}: with "
                f"{n_kv} metadata pairs the header needs at least {needed} bytes but "
                f"only {p.remaining} bytes remain in the file (corrupt or truncated "
                f"header)")
        return n_tensors, n_kv

    def _parse_kv(self, p: _HeaderParser, index: int) -> None:
        at = p.pos
        key = p.string(f"the key of metadata pair {index}")
        if key in self.metadata:
            raise self._error(
                f"duplicate metadata key '{key}' (pair {index} at offset {at})")
        vtype = p.value_type(f"the value type of key '{key}'")
        value, desc = p.value(vtype, key)
        self.metadata[key] = value
        self.metadata_types[key] = desc

    def _alignment_from_metadata(self) -> int:
        if GGUF_ALIGNMENT_KEY not in self.metadata:
            return GGUF_DEFAULT_ALIGNMENT
        vtype = self.metadata_types[GGUF_ALIGNMENT_KEY]
        value = self.metadata[GGUF_ALIGNMENT_KEY]
        if vtype not in _INT_VALUE_TYPES:
            name = vtype.name if isinstance(vtype, GGUFValueType) else "ARRAY"
            raise self._error(
                f"metadata key '{GGUF_ALIGNMENT_KEY}' must be an unsigned integer "
                f"(UINT32), found a {name} value {value!r}")
        if value <= 0 or value & (value - 1):
            raise self._error(
                f"metadata key '{GGUF_ALIGNMENT_KEY}' is {value}, but the alignment "
                f"must be a positive power of two")
        return value

    def _parse_tensor_info(self, p: _HeaderParser, index: int,
                           seen: set[str]) -> _RawTensorInfo:
        at = p.pos
        name = p.string(f"the name of tensor {index}")
        if name in seen:
            raise self._error(
                f"duplicate tensor name '{name}' (tensor {index}, info at offset {at})")
        seen.add(name)
        n_dims = p.u32(f"n_dims of tensor '{name}'")
        if n_dims == 0 or n_dims > MAX_N_DIMS:
            raise self._error(
                f"tensor '{name}' (info at offset {at}) has n_dims = {n_dims}; "
                f"expected 1 to {MAX_N_DIMS}")
        p.need(8 * n_dims, f"the {n_dims} dimensions of tensor '{name}'")
        ne = struct.unpack_from(f"<{n_dims}Q", p.buf, p.pos)
        p.pos += 8 * n_dims
        raw_type = p.u32(f"the type of tensor '{name}'")
        offset = p.u64(f"the data offset of tensor '{name}'")
        for i, d in enumerate(ne):
            if d == 0 or d >= 2**63:
                shown = d if d < 2**63 else d - 2**64
                raise self._error(
                    f"tensor '{name}' has dimension ne[{i}] = {shown}; every "
                    f"dimension must be positive (ne = {list(ne)})")
        if math.prod(ne) > MAX_ELEMENTS:
            raise self._error(
                f"tensor '{name}' has ne = {list(ne)}: the element count overflows "
                f"(more than 2**62 elements)")
        try:
            ggml_type = GGMLType(raw_type)
        except ValueError:
            raise self._error(
                f"tensor '{name}' has unknown tensor type {raw_type}; vllm-prism "
                f"supports: {_supported_types_text()}") from None
        min_block = (Q2_0_G64_LAYOUT.block_size if ggml_type == GGMLType.Q2_0
                     else GGML_BLOCK_LAYOUTS[ggml_type].block_size)
        if ne[0] % min_block:
            raise self._error(
                f"tensor '{name}' of type {ggml_type.name} has ne[0] = {ne[0]}, "
                f"which is not a multiple of the block size {min_block}")
        if offset % self.alignment:
            raise self._error(
                f"tensor '{name}' data offset {offset} is not aligned to "
                f"{self.alignment} bytes")
        return _RawTensorInfo(name, tuple(ne), ggml_type, offset, at)

    def _layout_tensors(self, raw: list[_RawTensorInfo]) -> dict[str, GGUFTensorInfo]:
        """Resolve layouts and sizes; check bounds and overlaps."""
        if raw and self.data_offset > self.file_size:
            raise self._error(
                f"truncated data: the data section starts at offset "
                f"{self.data_offset} but the file ends at {self.file_size}; the file "
                f"is incomplete, download it again")
        order = sorted(range(len(raw)), key=lambda i: raw[i].offset)
        resolved: dict[int, GGUFTensorInfo] = {}
        for k, i in enumerate(order):
            info = raw[i]
            nxt = raw[order[k + 1]] if k + 1 < len(order) else None
            if info.offset >= self.file_size:
                raise self._error(
                    f"tensor '{info.name}' data offset {info.offset} "
                    f"(relative {info.offset - self.data_offset}) is out of bounds: "
                    f"the file is only {self.file_size} bytes")
            layout = self._resolve_layout(info, nxt)
            nbytes = self._nbytes(info.ne, layout)
            end = info.offset + nbytes
            if end > self.file_size:
                raise self._error(
                    f"truncated data: tensor '{info.name}' needs bytes "
                    f"[{info.offset}, {end}) but the file ends at {self.file_size}; "
                    f"the file is incomplete, download it again")
            if nxt is not None and end > nxt.offset:
                raise self._error(
                    f"tensor '{info.name}' data [{info.offset}, {end}) overlaps "
                    f"tensor '{nxt.name}' starting at offset {nxt.offset}")
            resolved[i] = GGUFTensorInfo(info.name, info.ne, info.ggml_type,
                                         info.offset, nbytes, layout)
        return {resolved[i].name: resolved[i] for i in range(len(raw))}

    @staticmethod
    def _nbytes(ne: tuple[int, ...], layout: BlockLayout) -> int:
        return math.prod(ne) // layout.block_size * layout.type_size

    def _resolve_layout(self, info: _RawTensorInfo,
                        nxt: _RawTensorInfo | None) -> BlockLayout:
        if info.ggml_type != GGMLType.Q2_0:
            return GGML_BLOCK_LAYOUTS[info.ggml_type]
        return self._resolve_q2_0(info, nxt)

    def _resolve_q2_0(self, info: _RawTensorInfo,
                      nxt: _RawTensorInfo | None) -> BlockLayout:
        """Tell the two Q2_0 layouts apart by the space the tensor has in the file.

        The space is the distance to the next tensor's data (or to the end of the
        file for the last tensor). A layout fits when its size rounded up to the
        alignment equals that space (for the last tensor: when its size fits and
        leaves less than ``alignment`` bytes). Exactly one layout must fit.
        """
        candidates = [GGML_BLOCK_LAYOUTS[GGMLType.Q2_0], Q2_0_G64_LAYOUT]
        sizes = {lay.block_size: self._nbytes(info.ne, lay) for lay in candidates}
        if nxt is not None:
            space = nxt.offset - info.offset
        else:
            space = self.file_size - info.offset
        fits = []
        for lay in candidates:
            if info.ne[0] % lay.block_size:
                continue
            size = sizes[lay.block_size]
            if nxt is not None:
                ok = _align_up(size, self.alignment) == space
            else:
                ok = size <= space and space - size < self.alignment
            if ok:
                fits.append(lay)
        if len(fits) == 1:
            return fits[0]
        until = f"until tensor '{nxt.name}'" if nxt else "until the end of the file"
        sizes_text = (f"group 128 would take {sizes[128]} bytes"
                      if info.ne[0] % 128 == 0 else "group 128 is impossible "
                      f"(ne[0] = {info.ne[0]} is not a multiple of 128)")
        sizes_text += f", group 64 would take {sizes[64]} bytes"
        if not fits:
            raise self._error(
                f"Q2_0 tensor '{info.name}' (ne = {list(info.ne)}) matches neither "
                f"Q2_0 layout: it has {space} bytes {until}; {sizes_text} (alignment "
                f"{self.alignment}); the file is corrupt or truncated")
        raise self._error(
            f"Q2_0 tensor '{info.name}' (ne = {list(info.ne)}) is ambiguous: both "
            f"Q2_0 layouts fit its {space} bytes {until}; {sizes_text} (alignment "
            f"{self.alignment})")

    # ------------------------------------------------------------------ data access

    def _info(self, name: str) -> GGUFTensorInfo:
        if self._mm is None:
            raise self._error(f"cannot read tensor '{name}': the reader is closed")
        try:
            return self.tensors[name]
        except KeyError:
            raise self._error(
                f"no tensor named '{name}' in the file ({len(self.tensors)} "
                f"tensors)") from None

    def raw(self, name: str) -> np.ndarray:
        """Zero-copy uint8 view of a tensor's bytes, shape ``(*shape[:-1], row_bytes)``."""
        info = self._info(name)
        data = np.frombuffer(self._mm, dtype=np.uint8, count=info.nbytes,
                             offset=info.offset)
        return data.reshape(*info.shape[:-1], info.row_bytes)

    def tensor(self, name: str) -> np.ndarray:
        """Zero-copy view of a tensor.

        F32 gives float32 and F16 float16 of ``shape``; BF16 gives the uint16 bit
        patterns of ``shape`` (see :func:`float32_from_bf16_bits`); every block type
        gives the same uint8 view as :meth:`raw`.
        """
        info = self._info(name)
        dtype = _TENSOR_DTYPES.get(info.ggml_type)
        if dtype is None:
            return self.raw(name)
        data = np.frombuffer(self._mm, dtype=dtype, count=info.n_elements,
                             offset=info.offset)
        return data.reshape(info.shape)

    # ------------------------------------------------------------------ lifetime

    def close(self) -> None:
        """Unmap the file. Views handed out earlier keep the mapping alive."""
        mm, self._mm = self._mm, None
        if mm is not None:
            try:
                mm.close()
            except BufferError:
                pass  # numpy views still reference it; it is unmapped when they go

    def __enter__(self) -> GGUFReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"GGUFReader({self.path!r}, version={self.version}, "
                f"tensors={len(self.tensors)}, keys={len(self.metadata)})")
