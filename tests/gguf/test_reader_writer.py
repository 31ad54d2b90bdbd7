"""Tests of the GGUF reader and writer.

Expected values come from literals in this file, from hand-assembled bytes
(``struct.pack``) or from gguf-py (llama.cpp's own reader and writer), never from the
code under test.
"""

from __future__ import annotations

import math
import mmap
import struct
from pathlib import Path

import numpy as np
import pytest

from vllm_prism.gguf.constants import GGMLType, GGUFValueType
from vllm_prism.gguf.errors import GGUFError
from vllm_prism.gguf.floats import bf16_bits_from_float32, float32_from_bf16_bits
from vllm_prism.gguf.reader import GGUFReader
from vllm_prism.gguf.writer import GGUFWriter

V = GGUFValueType
T = GGMLType

# (elements per block, bytes per block) from section 1 of the spec and ggml.
BLOCKS = {
    "Q8_0": (32, 34),
    "PQ2_0": (128, 34),
    "PTQ1_0": (128, 28),
    "Q1_0": (128, 18),
    "Q2_0_g128": (128, 34),
    "Q2_0_g64": (64, 18),
    "TQ1_0": (256, 54),
    "TQ2_0": (256, 66),
}


# --------------------------------------------------------------------------- helpers
# A tiny independent GGUF assembler used for the hand-made and malformed files.

def s(text: str | bytes) -> bytes:
    data = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(data)) + data


def kv(key: str | bytes, vtype: int, payload: bytes) -> bytes:
    return s(key) + struct.pack("<I", vtype) + payload


def kv_str(key: str, value: str) -> bytes:
    return kv(key, 8, s(value))


def kv_u32(key: str, value: int) -> bytes:
    return kv(key, 4, struct.pack("<I", value))


def ti(name: str | bytes, ne: tuple[int, ...], gtype: int, offset: int,
       n_dims: int | None = None) -> bytes:
    n = len(ne) if n_dims is None else n_dims
    return (s(name) + struct.pack("<I", n) + struct.pack(f"<{len(ne)}Q", *ne)
            + struct.pack("<IQ", gtype, offset))


def assemble(kvs: list[bytes], infos: list[bytes], data: bytes, *, version: int = 3,
             alignment: int = 32, magic: bytes = b"GGUF", n_tensors: int | None = None,
             n_kv: int | None = None) -> bytes:
    head = magic + struct.pack("<IQQ", version,
                               len(infos) if n_tensors is None else n_tensors,
                               len(kvs) if n_kv is None else n_kv)
    head += b"".join(kvs) + b"".join(infos)
    head += bytes(-len(head) % alignment)
    return head + data


def base_file(**overrides) -> bytes:
    """Valid v3 file: one string key; 'a' F32 [2, 32] at 0, 'b' Q8_0 [4, 32] at 256."""
    parts = dict(
        kvs=[kv_str("general.architecture", "llama")],
        infos=[ti("a", (32, 2), 0, 0), ti("b", (32, 4), 8, 256)],
        data=bytes(256) + bytes(range(136)),
    )
    parts.update(overrides)
    return assemble(parts.pop("kvs"), parts.pop("infos"), parts.pop("data"), **parts)


def header_len(kvs: list[bytes], infos: list[bytes]) -> int:
    return 24 + sum(map(len, kvs)) + sum(map(len, infos))


def write_bytes(tmp_path: Path, data: bytes, name: str = "f.gguf") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def view_base(a: np.ndarray) -> object:
    """The object owning a view's memory (numpy 2 interposes a memoryview)."""
    while isinstance(a, (np.ndarray, memoryview)):
        a = a.base if isinstance(a, np.ndarray) else a.obj
    return a


# --------------------------------------------------------------------------- metadata

# key -> (value, explicit type or None, expected value read back, expected type)
METADATA = {
    "u8": (255, V.UINT8, 255, V.UINT8),
    "i8": (-128, V.INT8, -128, V.INT8),
    "u16": (65535, V.UINT16, 65535, V.UINT16),
    "i16": (-32768, V.INT16, -32768, V.INT16),
    "u32": (2**32 - 1, V.UINT32, 2**32 - 1, V.UINT32),
    "i32": (-(2**31), V.INT32, -(2**31), V.INT32),
    "u64": (2**64 - 1, V.UINT64, 2**64 - 1, V.UINT64),
    "i64": (-(2**63), V.INT64, -(2**63), V.INT64),
    "f32": (1e-6, V.FLOAT32, struct.unpack("<f", struct.pack("<f", 1e-6))[0], V.FLOAT32),
    "f64": (0.1, V.FLOAT64, 0.1, V.FLOAT64),
    "bool_t": (True, V.BOOL, True, V.BOOL),
    "bool_f": (False, V.BOOL, False, V.BOOL),
    "str": ("h\u00e9llo \u2713 \U0001F600", V.STRING, "h\u00e9llo \u2713 \U0001F600", V.STRING),
    "str_empty": ("", V.STRING, "", V.STRING),
    "inf_int": (7, None, 7, V.INT32),
    "inf_int64": (2**40, None, 2**40, V.INT64),
    "inf_uint64": (2**63, None, 2**63, V.UINT64),
    "inf_float": (0.5, None, 0.5, V.FLOAT32),
    "inf_bool": (True, None, True, V.BOOL),
    "inf_str": ("x", None, "x", V.STRING),
    "inf_list_int": ([1, -2, 3], None, [1, -2, 3], (V.ARRAY, V.INT32)),
    "inf_list_float": ([1.5, 2], None, [1.5, 2.0], (V.ARRAY, V.FLOAT32)),
    "inf_list_str": (["a", "", "\u00fc"], None, ["a", "", "\u00fc"], (V.ARRAY, V.STRING)),
    "inf_list_bool": ([True, False], None, [True, False], (V.ARRAY, V.BOOL)),
    "inf_tuple": ((1, 2), None, [1, 2], (V.ARRAY, V.INT32)),
    "inf_ndarray": (np.array([3, 4], np.int64), None, [3, 4], (V.ARRAY, V.INT32)),
    "inf_nested": ([[1, 2], [3], []], None, [[1, 2], [3], []],
                   (V.ARRAY, V.ARRAY, V.INT32)),
    "inf_nested3": ([[["a"]], [["b", "c"]]], None, [[["a"]], [["b", "c"]]],
                    (V.ARRAY, V.ARRAY, V.ARRAY, V.STRING)),
}
for _t, _vals in [
    (V.UINT8, [0, 255]), (V.INT8, [-128, 127]), (V.UINT16, [0, 65535]),
    (V.INT16, [-32768, 32767]), (V.UINT32, [0, 2**32 - 1]),
    (V.INT32, [-(2**31), 2**31 - 1]), (V.UINT64, [0, 2**64 - 1]),
    (V.INT64, [-(2**63), 2**63 - 1]), (V.FLOAT32, [0.25, -2.0]),
    (V.FLOAT64, [0.1, -1e300]), (V.BOOL, [True, False, True]),
    (V.STRING, ["x", "", "\u4e2d\u6587"]),
]:
    METADATA[f"arr_{_t.name}"] = (_vals, None, _vals, (V.ARRAY, _t))
    METADATA[f"empty_{_t.name}"] = ([], None, [], (V.ARRAY, _t))


def _add_all(w: GGUFWriter) -> None:
    for key, (value, vtype, _, etype) in METADATA.items():
        if key.startswith("arr_") or key.startswith("empty_"):
            w.add_metadata(key, value, V.ARRAY, etype[1])
        else:
            w.add_metadata(key, value, vtype)
    # Explicit nested types, incl. empty arrays of arrays.
    w.add_metadata("nested_u16", [[1, 2], [65535]], V.ARRAY, (V.ARRAY, V.UINT16))
    w.add_metadata("nested_empty", [], V.ARRAY, V.ARRAY)
    w.add_metadata("nested_inner_empty", [[], []], (V.ARRAY, V.ARRAY, V.FLOAT64))


@pytest.mark.parametrize("version", [2, 3])
@pytest.mark.parametrize("alignment", [32, 64])
def test_metadata_round_trip(tmp_path: Path, version: int, alignment: int) -> None:
    path = tmp_path / "m.gguf"
    w = GGUFWriter(path, version=version, alignment=alignment)
    _add_all(w)
    w.add_tensor("t", np.arange(3, dtype=np.float32), T.F32)
    w.write()
    with GGUFReader(path) as r:
        assert r.version == version
        assert r.alignment == alignment
        assert r.data_offset % alignment == 0
        for key, (_, _, expected, etype) in METADATA.items():
            got = r.metadata[key]
            assert got == expected, key
            assert r.metadata_types[key] == etype, key
            if etype in (V.FLOAT32, V.FLOAT64):
                assert type(got) is float
            if etype == V.BOOL:
                assert type(got) is bool
            if etype == (V.ARRAY, V.BOOL):
                assert all(type(x) is bool for x in got), key
            if etype in ((V.ARRAY, V.FLOAT32), (V.ARRAY, V.FLOAT64)):
                assert all(type(x) is float for x in got), key
            if etype in ((V.ARRAY, V.UINT64), (V.ARRAY, V.INT32)):
                assert all(type(x) is int for x in got), key
        assert r.metadata["nested_u16"] == [[1, 2], [65535]]
        assert r.metadata_types["nested_u16"] == (V.ARRAY, V.ARRAY, V.UINT16)
        assert r.metadata["nested_empty"] == []
        assert r.metadata_types["nested_empty"] == (V.ARRAY, V.ARRAY)
        assert r.metadata["nested_inner_empty"] == [[], []]
        assert r.metadata_types["nested_inner_empty"] == (V.ARRAY, V.ARRAY, V.FLOAT64)
        keys = list(r.metadata)
        assert keys[:len(METADATA)] == list(METADATA)  # file order kept
        if alignment == 32:
            assert "general.alignment" not in r.metadata
        else:
            assert r.metadata["general.alignment"] == alignment
            assert r.metadata_types["general.alignment"] == V.UINT32
        np.testing.assert_array_equal(r.tensor("t"), [0.0, 1.0, 2.0])


def test_metadata_types_reproduce_file_bytes(tmp_path: Path) -> None:
    """Copying every key with reader.metadata_types reproduces the file byte for byte."""
    src = tmp_path / "src.gguf"
    w = GGUFWriter(src, alignment=64)
    _add_all(w)
    w.add_tensor("t", np.ones((2, 3), np.float16), T.F16)
    w.write()
    dst = tmp_path / "dst.gguf"
    with GGUFReader(src) as r:
        w2 = GGUFWriter(dst, version=r.version, alignment=r.alignment)
        for key, value in r.metadata.items():
            w2.add_metadata(key, value, r.metadata_types[key])
        w2.add_tensor("t", r.tensor("t"), T.F16)
        w2.write()
    assert dst.read_bytes() == src.read_bytes()


def test_heterogeneous_nested_array_types(tmp_path: Path) -> None:
    """Inner arrays of different element types are described per element."""
    data = assemble(
        [kv("mixed", 9, struct.pack("<IQ", 9, 2)
            + struct.pack("<IQ", 4, 1) + struct.pack("<I", 7)
            + struct.pack("<IQ", 8, 1) + s("z"))],
        [], b"")
    path = write_bytes(tmp_path, data)
    with GGUFReader(path) as r:
        assert r.metadata["mixed"] == [[7], ["z"]]
        desc = r.metadata_types["mixed"]
        assert desc == (V.ARRAY, V.ARRAY, [(V.ARRAY, V.UINT32), (V.ARRAY, V.STRING)])
        w = GGUFWriter(tmp_path / "copy.gguf")
        w.add_metadata("mixed", r.metadata["mixed"], desc)
        w.write()
    assert (tmp_path / "copy.gguf").read_bytes() == data


def test_array_nesting_depth_8_is_accepted(tmp_path: Path) -> None:
    payload = struct.pack("<IQ", 5, 1) + struct.pack("<i", -3)  # depth 8: INT32[1]
    for _ in range(7):
        payload = struct.pack("<IQ", 9, 1) + payload
    path = write_bytes(tmp_path, assemble([kv("deep", 9, payload)], [], b""))
    with GGUFReader(path) as r:
        assert r.metadata["deep"] == [[[[[[[[-3]]]]]]]]
        assert r.metadata_types["deep"] == (V.ARRAY,) * 8 + (V.INT32,)


@pytest.mark.parametrize("value, vtype, etype, phrase", [
    (256, V.UINT8, None, "out of range for UINT8"),
    (-1, V.UINT32, None, "out of range for UINT32"),
    ("x", V.INT32, None, "expected an integer"),
    (1, V.STRING, None, "expected a str"),
    ([1, "a"], None, None, "cannot infer one GGUF type"),
    ([], None, None, "pass element_type"),
    ([1, [2]], None, None, "mixes nested arrays and scalars"),
    ([1, 2**32], V.ARRAY, V.UINT32, "out of range for UINT32"),
    (2**64, None, None, "does not fit in 64 bits"),
    ("\ud800", V.STRING, None, "UTF-8"),
])
def test_writer_refuses_bad_metadata(tmp_path: Path, value, vtype, etype,
                                     phrase: str) -> None:
    w = GGUFWriter(tmp_path / "x.gguf")
    with pytest.raises(GGUFError, match="metadata key 'k'") as exc:
        w.add_metadata("k", value, vtype, etype)
    assert phrase in str(exc.value)


def test_writer_refuses_duplicates_and_bad_tensors(tmp_path: Path) -> None:
    w = GGUFWriter(tmp_path / "x.gguf")
    w.add_metadata("k", 1)
    with pytest.raises(GGUFError, match="duplicate metadata key 'k'"):
        w.add_metadata("k", 2)
    w.add_tensor("t", np.zeros(4, np.float32), T.F32)
    with pytest.raises(GGUFError, match="duplicate tensor name 't'"):
        w.add_tensor("t", np.zeros(4, np.float32), T.F32)
    with pytest.raises(GGUFError, match="takes 68 bytes, got 34"):
        w.add_tensor("q", np.zeros(34, np.uint8), T.Q8_0, shape=(2, 32))
    with pytest.raises(GGUFError, match="not a multiple of the PQ2_0 block size 128"):
        w.add_tensor("p", np.zeros(34, np.uint8), T.PQ2_0, shape=(1, 64))
    with pytest.raises(GGUFError, match="needs shape="):
        w.add_tensor("p", np.zeros(34, np.uint8), T.PQ2_0)
    with pytest.raises(GGUFError, match="q2_0_group must be 64 or 128"):
        w.add_tensor("p", np.zeros(34, np.uint8), T.Q2_0, shape=(1, 128), q2_0_group=32)
    with pytest.raises(GGUFError, match="unknown tensor type 99"):
        w.add_tensor("p", np.zeros(34, np.uint8), 99, shape=(1, 128))
    with pytest.raises(GGUFError, match="alignment 48 is not a positive power of two"):
        GGUFWriter(tmp_path / "y.gguf", alignment=48)
    with pytest.raises(GGUFError, match="cannot write GGUF version 1"):
        GGUFWriter(tmp_path / "y.gguf", version=1)
    with pytest.raises(GGUFError, match="disagrees with the writer's alignment 32"):
        w.add_metadata("general.alignment", 64, V.UINT32)


# --------------------------------------------------------------------------- tensors

def _block_tensors() -> list[tuple[str, GGMLType, tuple, int, str]]:
    """(name, type, numpy shape, q2_0 group, BLOCKS key) of every block tensor."""
    return [
        ("q8", T.Q8_0, (3, 64), 128, "Q8_0"),
        ("pq2", T.PQ2_0, (5, 256), 128, "PQ2_0"),
        ("ptq1", T.PTQ1_0, (2, 3, 128), 128, "PTQ1_0"),
        ("q1", T.Q1_0, (4, 384), 128, "Q1_0"),
        ("q2_g128", T.Q2_0, (16, 256), 128, "Q2_0_g128"),
        ("q2_g64_mid", T.Q2_0, (16, 256), 64, "Q2_0_g64"),
        ("tq1", T.TQ1_0, (2, 512), 128, "TQ1_0"),
        ("tq2", T.TQ2_0, (3, 256), 128, "TQ2_0"),
        ("q2_g64_odd", T.Q2_0, (3, 192), 64, "Q2_0_g64"),  # 192: only group 64 divides
        ("q2_g64_last", T.Q2_0, (8, 512), 64, "Q2_0_g64"),
    ]


@pytest.mark.parametrize("version", [2, 3])
@pytest.mark.parametrize("alignment", [32, 64])
def test_tensor_round_trip(tmp_path: Path, version: int, alignment: int) -> None:
    rng = np.random.default_rng(0)
    path = tmp_path / "t.gguf"
    w = GGUFWriter(path, version=version, alignment=alignment)
    w.add_metadata("general.architecture", "llama")
    f32 = rng.standard_normal((3, 5)).astype(np.float32)
    f16 = rng.standard_normal((2, 7)).astype(np.float16)
    bf16_bits = rng.integers(0, 2**16, size=(4, 6), dtype=np.uint16)
    bf16_f32 = np.array([1.0, -2.5, 3.140625, 1e-3], np.float32)
    w.add_tensor("f32", f32, T.F32)
    w.add_tensor("f16", f16, T.F16)
    w.add_tensor("bf16", bf16_bits, T.BF16)
    w.add_tensor("bf16_from_f32", bf16_f32, T.BF16, shape=(2, 2))
    w.add_tensor("f32_1d_shape", f32, T.F32, shape=(15,))
    expected_raw = {}
    blocks = _block_tensors()
    for name, gtype, shape, group, key in blocks:
        bs, ts = BLOCKS[key]
        nbytes = math.prod(shape) // bs * ts
        data = rng.integers(0, 256, size=nbytes, dtype=np.uint8)
        expected_raw[name] = (data, shape, bs, ts, nbytes)
        w.add_tensor(name, data, gtype, shape=shape, q2_0_group=group)
    w.write()

    with GGUFReader(path) as r:
        assert list(r.tensors) == ["f32", "f16", "bf16", "bf16_from_f32", "f32_1d_shape",
                                   *(b[0] for b in blocks)]
        infos = sorted(r.tensors.values(), key=lambda i: i.offset)
        assert infos[-1].name == "q2_g64_last"
        for info in r.tensors.values():
            assert info.offset % alignment == 0
            assert info.offset >= r.data_offset
        t = r.tensor("f32")
        assert t.dtype == np.float32 and t.shape == (3, 5)
        np.testing.assert_array_equal(t, f32)
        assert r.tensors["f32"].ne == (5, 3) and r.tensors["f32"].shape == (3, 5)
        assert r.tensors["f32"].nbytes == 60 and r.tensors["f32"].n_elements == 15
        t = r.tensor("f16")
        assert t.dtype == np.float16 and t.shape == (2, 7)
        np.testing.assert_array_equal(t, f16)
        t = r.tensor("bf16")
        assert t.dtype == np.uint16 and t.shape == (4, 6)
        np.testing.assert_array_equal(t, bf16_bits)
        np.testing.assert_array_equal(r.tensor("bf16_from_f32"),
                                      [[0x3F80, 0xC020], [0x4049, 0x3A83]])
        np.testing.assert_array_equal(r.tensor("f32_1d_shape"), f32.reshape(-1))
        assert r.raw("f32").shape == (3, 20)
        for name, gtype, _, _, _ in blocks:
            data, shape, bs, ts, nbytes = expected_raw[name]
            info = r.tensors[name]
            assert info.ggml_type == gtype
            assert info.ne == tuple(reversed(shape))
            assert info.shape == shape
            assert info.nbytes == nbytes
            assert (info.layout.block_size, info.layout.type_size) == (bs, ts), name
            assert info.row_bytes == shape[-1] // bs * ts
            raw = r.raw(name)
            assert raw.dtype == np.uint8
            assert raw.shape == (*shape[:-1], shape[-1] // bs * ts)
            np.testing.assert_array_equal(raw.reshape(-1), data)
            np.testing.assert_array_equal(r.tensor(name), raw)


def test_views_are_zero_copy_and_read_only(tmp_path: Path) -> None:
    path = tmp_path / "z.gguf"
    w = GGUFWriter(path)
    w.add_tensor("f", np.arange(64, dtype=np.float32).reshape(8, 8), T.F32)
    w.add_tensor("p", np.arange(2 * 34, dtype=np.uint8), T.PQ2_0, shape=(2, 128))
    w.write()
    r = GGUFReader(path)
    for name in ("f", "p"):
        t, raw = r.tensor(name), r.raw(name)
        assert isinstance(view_base(t), mmap.mmap)
        assert isinstance(view_base(raw), mmap.mmap)
        assert np.shares_memory(t, raw)
        assert not t.flags.writeable
    # Bytes of 'f' in the file are exactly the view's bytes.
    info = r.tensors["f"]
    assert path.read_bytes()[info.offset:info.offset + info.nbytes] == r.raw("f").tobytes()
    kept = r.tensor("f")
    r.close()  # a live view keeps the mapping valid
    assert kept[7, 7] == 63.0
    with pytest.raises(GGUFError, match="reader is closed"):
        r.tensor("f")


def test_unknown_tensor_name(tmp_path: Path) -> None:
    path = write_bytes(tmp_path, base_file())
    with GGUFReader(path) as r, pytest.raises(GGUFError, match="no tensor named 'zz'"):
        r.raw("zz")


# --------------------------------------------------------------------------- bf16

def test_bf16_round_to_nearest_even() -> None:
    bits = np.array([0x3F800000, 0x3F808000, 0x3F818000, 0x3F808001, 0x3F80FFFF,
                     0x7F7FFFFF, 0xFF800000, 0x7F800000, 0x80000000, 0x7FC00001,
                     0xFFA00000, 0x00000001], np.uint32)
    expected = np.array([0x3F80, 0x3F80, 0x3F82, 0x3F81, 0x3F81,
                         0x7F80, 0xFF80, 0x7F80, 0x8000, 0x7FC0,
                         0xFFE0, 0x0000], np.uint16)
    np.testing.assert_array_equal(bf16_bits_from_float32(bits.view(np.float32)), expected)
    back = float32_from_bf16_bits(np.array([0x3F80, 0xC020, 0x7F80], np.uint16))
    np.testing.assert_array_equal(back, np.array([1.0, -2.5, np.inf], np.float32))
    assert back.dtype == np.float32


# --------------------------------------------------------------------------- hand-made

def test_hand_assembled_v2_file(tmp_path: Path) -> None:
    values = np.arange(8, dtype="<f4") * 0.5
    head = b"GGUF" + struct.pack("<IQQ", 2, 1, 1)
    head += struct.pack("<Q", 12) + b"general.name" + struct.pack("<I", 8)
    head += struct.pack("<Q", 4) + b"tiny"
    head += struct.pack("<Q", 1) + b"w" + struct.pack("<I", 2) + struct.pack("<QQ", 4, 2)
    head += struct.pack("<IQ", 0, 0)
    data_offset = (len(head) + 31) // 32 * 32
    blob = head + bytes(data_offset - len(head)) + values.tobytes()
    path = write_bytes(tmp_path, blob)
    with GGUFReader(path) as r:
        assert r.version == 2
        assert r.alignment == 32
        assert r.data_offset == data_offset
        assert r.metadata == {"general.name": "tiny"}
        assert r.metadata_types == {"general.name": V.STRING}
        info = r.tensors["w"]
        assert (info.ne, info.ggml_type, info.offset, info.nbytes) == (
            (4, 2), T.F32, data_offset, 32)
        np.testing.assert_array_equal(r.tensor("w"), values.reshape(2, 4))


def test_hand_assembled_prism_types(tmp_path: Path) -> None:
    """PQ2_0 / PTQ1_0 and a last Q2_0 group-64 tensor with no trailing padding."""
    pq2 = bytes(range(34)) * 2            # [2, 128]
    ptq1 = bytes(range(100, 128)) * 3     # [3, 128]
    q2 = bytes(range(18)) * 64            # [16, 256] group 64 = 1152 bytes
    data = pq2 + bytes(96 - 68) + ptq1 + bytes(192 - 96 - 84) + q2
    blob = assemble([kv_u32("general.file_type", 141)],
                    [ti("pq2", (128, 2), 142, 0), ti("ptq1", (128, 3), 143, 96),
                     ti("q2", (256, 16), 42, 192)], data)
    path = write_bytes(tmp_path, blob)
    with GGUFReader(path) as r:
        assert r.tensors["pq2"].ggml_type == T.PQ2_0
        assert r.raw("pq2").tobytes() == pq2
        assert r.raw("pq2").shape == (2, 34)
        assert r.raw("ptq1").tobytes() == ptq1
        assert r.raw("ptq1").shape == (3, 28)
        assert (r.tensors["q2"].layout.block_size, r.tensors["q2"].layout.type_size) == (64, 18)
        assert r.raw("q2").tobytes() == q2
        assert r.raw("q2").shape == (16, 72)


def test_q2_0_group_128_in_the_middle_by_next_offset(tmp_path: Path) -> None:
    q2 = bytes(16 * 2 * 34)  # [16, 256] group 128 = 1088 bytes
    blob = assemble([], [ti("q2", (256, 16), 42, 0), ti("f", (8,), 0, 1088)],
                    q2 + np.ones(8, "<f4").tobytes())
    path = write_bytes(tmp_path, blob)
    with GGUFReader(path) as r:
        assert r.tensors["q2"].layout.block_size == 128
        assert r.tensors["q2"].nbytes == 1088


# --------------------------------------------------------------------------- gguf-py

gguf = pytest.importorskip("gguf")


def test_our_file_read_by_gguf_py(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    path = tmp_path / "ours.gguf"
    w = GGUFWriter(path, alignment=64)
    meta = {
        "general.architecture": ("qwen3", V.STRING, None),
        "qwen3.block_count": (4, V.UINT32, None),
        "qwen3.rope.freq_base": (1000000.0, V.FLOAT32, None),
        "some.i8": (-5, V.INT8, None),
        "some.u64": (2**60, V.UINT64, None),
        "some.f64": (0.1, V.FLOAT64, None),
        "some.bool": (True, V.BOOL, None),
        "tokenizer.ggml.tokens": (["<s>", "h\u00e9", ""], V.ARRAY, V.STRING),
        "tokenizer.ggml.scores": ([0.5, -1.0, 2.0], V.ARRAY, V.FLOAT32),
        "tokenizer.ggml.token_type": ([1, 2, 3], V.ARRAY, V.INT32),
    }
    for key, (value, vt, et) in meta.items():
        w.add_metadata(key, value, vt, et)
    f32 = rng.standard_normal((4, 32)).astype(np.float32)
    f16 = rng.standard_normal((3, 8)).astype(np.float16)
    bf16 = rng.integers(0, 2**16, size=(2, 16), dtype=np.uint16)
    q8 = rng.integers(0, 256, size=5 * 2 * 34, dtype=np.uint8)
    w.add_tensor("f32", f32, T.F32)
    w.add_tensor("f16", f16, T.F16)
    w.add_tensor("bf16", bf16, T.BF16)
    w.add_tensor("q8", q8, T.Q8_0, shape=(5, 64))
    w.write()

    g = gguf.GGUFReader(str(path))
    assert g.alignment == 64
    fields = {k: f for k, f in g.fields.items() if not k.startswith("GGUF.")}
    assert list(fields) == [*meta, "general.alignment"]
    for key, (value, vt, et) in meta.items():
        f = fields[key]
        assert int(f.types[0]) == int(vt), key
        if et is not None:
            assert int(f.types[-1]) == int(et), key
        got = f.contents()
        if vt == V.FLOAT32 or et == V.FLOAT32:
            np.testing.assert_allclose(got, value, rtol=1e-7)
        else:
            assert got == value, key
    assert fields["general.alignment"].contents() == 64
    assert int(fields["general.alignment"].types[0]) == int(V.UINT32)

    tensors = {t.name: t for t in g.tensors}
    assert list(tensors) == ["f32", "f16", "bf16", "q8"]
    expect = {"f32": (0, [32, 4], f32.tobytes()), "f16": (1, [8, 3], f16.tobytes()),
              "bf16": (30, [16, 2], bf16.tobytes()), "q8": (8, [64, 5], q8.tobytes())}
    for name, (gtype, ne, data) in expect.items():
        t = tensors[name]
        assert int(t.tensor_type) == gtype
        assert list(map(int, t.shape)) == ne
        assert t.n_bytes == len(data)
        assert np.asarray(t.data).tobytes() == data
        assert t.data_offset % 64 == 0


def test_gguf_py_file_read_by_us(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    path = tmp_path / "theirs.gguf"
    g = gguf.GGUFWriter(str(path), "llama")
    g.add_uint8("v.u8", 200)
    g.add_int8("v.i8", -100)
    g.add_uint16("v.u16", 60000)
    g.add_int16("v.i16", -30000)
    g.add_uint32("v.u32", 4000000000)
    g.add_int32("v.i32", -2000000000)
    g.add_uint64("v.u64", 2**63 + 5)
    g.add_int64("v.i64", -(2**62))
    g.add_float32("v.f32", 0.25)
    g.add_float64("v.f64", 1e-300)
    g.add_bool("v.bool", True)
    g.add_string("v.str", "caf\u00e9")
    g.add_array("v.arr_str", ["a", "bb", ""])
    g.add_array("v.arr_int", [1, -2, 3])
    g.add_array("v.arr_float", [0.5, 1.5])
    g.add_array("v.arr_bool", [False, True])
    g.add_array("v.nested", [[1, 2], [3]])
    f32 = rng.standard_normal((3, 32)).astype(np.float32)
    f16 = rng.standard_normal((2, 4)).astype(np.float16)
    q8 = rng.integers(0, 256, size=(2, 68), dtype=np.uint8)
    g.add_tensor("f32", f32)
    g.add_tensor("f16", f16)
    g.add_tensor("q8", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    g.write_header_to_file()
    g.write_kv_data_to_file()
    g.write_tensors_to_file()
    g.close()

    with GGUFReader(path) as r:
        assert r.version == 3
        expected = {
            "general.architecture": ("llama", V.STRING),
            "v.u8": (200, V.UINT8), "v.i8": (-100, V.INT8),
            "v.u16": (60000, V.UINT16), "v.i16": (-30000, V.INT16),
            "v.u32": (4000000000, V.UINT32), "v.i32": (-2000000000, V.INT32),
            "v.u64": (2**63 + 5, V.UINT64), "v.i64": (-(2**62), V.INT64),
            "v.f32": (0.25, V.FLOAT32), "v.f64": (1e-300, V.FLOAT64),
            "v.bool": (True, V.BOOL), "v.str": ("caf\u00e9", V.STRING),
            "v.arr_str": (["a", "bb", ""], (V.ARRAY, V.STRING)),
            "v.arr_int": ([1, -2, 3], (V.ARRAY, V.INT32)),
            "v.arr_float": ([0.5, 1.5], (V.ARRAY, V.FLOAT32)),
            "v.arr_bool": ([False, True], (V.ARRAY, V.BOOL)),
            "v.nested": ([[1, 2], [3]], (V.ARRAY, V.ARRAY, V.INT32)),
        }
        assert r.metadata == {k: v for k, (v, _) in expected.items()}
        assert r.metadata_types == {k: t for k, (_, t) in expected.items()}
        assert list(r.tensors) == ["f32", "f16", "q8"]
        np.testing.assert_array_equal(r.tensor("f32"), f32)
        np.testing.assert_array_equal(r.tensor("f16"), f16)
        assert r.tensors["q8"].ne == (64, 2)
        np.testing.assert_array_equal(r.raw("q8"), q8)


# --------------------------------------------------------------------------- malformed

def _truncated_in(section: str) -> bytes:
    full = base_file()
    kvs = [kv_str("general.architecture", "llama")]
    if section == "kv":
        return full[:24 + 20]
    infos = [ti("a", (32, 2), 0, 0), ti("b", (32, 4), 8, 256)]
    return full[:header_len(kvs, []) + len(infos[0]) + 10]


def _huge_string_array() -> bytes:
    payload = struct.pack("<IQ", 8, 2) + s("ok") + struct.pack("<Q", 2**62) + b"xx"
    return base_file(kvs=[kv("tokens", 9, payload)])


def _deep(depth: int) -> bytes:
    payload = struct.pack("<IQ", 5, 0)
    for _ in range(depth - 1):
        payload = struct.pack("<IQ", 9, 1) + payload
    return base_file(kvs=[kv("deep", 9, payload)])


def _q2_last(rows: int, cols: int, extra: int) -> bytes:
    nbytes = rows * cols // 64 * 18
    return base_file(infos=[ti("q2", (cols, rows), 42, 0)], data=bytes(nbytes + extra))


MALFORMED = [
    ("bad_magic", lambda: base_file(magic=b"GGML"), ["not a GGUF file", "b'GGML'"]),
    ("version_1", lambda: base_file(version=1),
     ["unsupported GGUF version 1 (vllm-prism reads versions 2 and 3)"]),
    ("version_4", lambda: base_file(version=4),
     ["unsupported GGUF version 4 (vllm-prism reads versions 2 and 3)"]),
    ("big_endian", lambda: base_file(version=0x03000000), ["big-endian"]),
    ("truncated_magic", lambda: b"GG", ["truncated header", "the magic"]),
    ("truncated_version", lambda: b"GGUF\x03", ["truncated header", "GGUF version"]),
    ("truncated_kv", lambda: _truncated_in("kv"), ["truncated header"]),
    ("truncated_tensor_info", lambda: _truncated_in("ti"), ["truncated header",
                                                             "tensor 'b'"]),
    ("truncated_data", lambda: base_file()[:-10], ["truncated data", "tensor 'b'"]),
    ("data_section_missing",
     lambda: base_file()[:header_len([kv_str("general.architecture", "llama")],
                                     [ti("a", (32, 2), 0, 0), ti("b", (32, 4), 8, 256)])],
     ["truncated data", "data section starts"]),
    ("offset_out_of_bounds",
     lambda: base_file(infos=[ti("a", (32, 2), 0, 0), ti("b", (32, 4), 8, 2**40)]),
     ["tensor 'b'", "out of bounds"]),
    ("overlap",
     lambda: base_file(infos=[ti("a", (32, 2), 0, 0), ti("b", (32, 4), 8, 224)]),
     ["tensor 'a'", "overlaps tensor 'b'"]),
    ("same_offset",
     lambda: base_file(infos=[ti("a", (32, 2), 0, 0), ti("b", (32, 4), 8, 0)]),
     ["overlaps"]),
    ("unaligned_offset",
     lambda: base_file(infos=[ti("a", (32, 2), 0, 0), ti("b", (32, 4), 8, 240)]),
     ["tensor 'b' data offset 240 is not aligned to 32 bytes"]),
    ("unknown_tensor_type",
     lambda: base_file(infos=[ti("a", (32, 2), 0, 0), ti("b", (32, 4), 99, 256)]),
     ["tensor 'b' has unknown tensor type 99", "PQ2_0 (142)", "PTQ1_0 (143)"]),
    ("ne0_not_multiple",
     lambda: base_file(infos=[ti("a", (32, 2), 0, 0), ti("b", (48, 2), 8, 256)]),
     ["tensor 'b'", "ne[0] = 48", "not a multiple of the block size 32"]),
    ("n_dims_0",
     lambda: base_file(infos=[ti("a", (), 0, 0, n_dims=0)]),
     ["tensor 'a'", "n_dims = 0"]),
    ("n_dims_5",
     lambda: base_file(infos=[ti("a", (1, 1, 1, 1, 1), 0, 0)]),
     ["tensor 'a'", "n_dims = 5"]),
    ("zero_dim",
     lambda: base_file(infos=[ti("a", (32, 0), 0, 0)]),
     ["tensor 'a'", "ne[1] = 0", "must be positive"]),
    ("negative_dim",
     lambda: base_file(infos=[ti("a", (2**64 - 1, 2), 0, 0)]),
     ["tensor 'a'", "ne[0] = -1", "must be positive"]),
    ("element_overflow",
     lambda: base_file(infos=[ti("a", (2**31, 2**31, 2**31), 0, 0)]),
     ["tensor 'a'", "overflows"]),
    ("duplicate_tensor",
     lambda: base_file(infos=[ti("a", (32, 2), 0, 0), ti("a", (32, 4), 8, 256)]),
     ["duplicate tensor name 'a'"]),
    ("duplicate_key",
     lambda: base_file(kvs=[kv_str("general.architecture", "llama"),
                            kv_u32("general.architecture", 1)]),
     ["duplicate metadata key 'general.architecture'"]),
    ("unknown_value_type",
     lambda: base_file(kvs=[kv("weird", 13, b"\0" * 8)]),
     ["unknown metadata value type 13", "key 'weird'"]),
    ("unknown_array_element_type",
     lambda: base_file(kvs=[kv("weird", 9, struct.pack("<IQ", 77, 1) + b"\0" * 8)]),
     ["unknown metadata value type 77", "key 'weird'"]),
    ("huge_tensor_count", lambda: base_file(n_tensors=2**63), ["implausible tensor count"]),
    ("huge_tensor_count_small",
     lambda: base_file(n_tensors=50), ["implausible tensor count 50"]),
    ("huge_kv_count", lambda: base_file(n_kv=2**64 - 1),
     ["implausible metadata key/value count"]),
    ("huge_key_length",
     lambda: base_file(kvs=[struct.pack("<Q", 2**63) + b"general"]),
     ["implausible string length", "key of metadata pair 0"]),
    ("huge_string_value",
     lambda: base_file(kvs=[kv("k", 8, struct.pack("<Q", 10**12) + b"abc")]),
     ["implausible string length 1000000000000", "key 'k'"]),
    ("huge_array_length",
     lambda: base_file(kvs=[kv("arr", 9, struct.pack("<IQ", 4, 2**61))]),
     ["implausible array length of key 'arr'"]),
    ("huge_nested_array_length",
     lambda: base_file(kvs=[kv("arr", 9, struct.pack("<IQ", 9, 2**40))]),
     ["implausible array length of key 'arr'"]),
    ("huge_string_in_array", _huge_string_array,
     ["implausible string length", "string 1 of array 'tokens'"]),
    ("huge_tensor_name",
     lambda: base_file(infos=[struct.pack("<Q", 2**50) + b"a"]),
     ["implausible string length", "name of tensor 0"]),
    ("nesting_9", lambda: _deep(9), ["nested 9 deep", "key 'deep'"]),
    ("alignment_not_pow2",
     lambda: base_file(kvs=[kv_u32("general.alignment", 48)]),
     ["general.alignment", "48", "power of two"]),
    ("alignment_zero",
     lambda: base_file(kvs=[kv_u32("general.alignment", 0)]), ["power of two"]),
    ("alignment_string",
     lambda: base_file(kvs=[kv_str("general.alignment", "32")]),
     ["general.alignment", "must be an unsigned integer"]),
    ("invalid_utf8_key",
     lambda: base_file(kvs=[kv(b"bad\xff", 4, b"\0" * 4)]),
     ["key of metadata pair 0", "not valid UTF-8"]),
    ("invalid_utf8_string",
     lambda: base_file(kvs=[kv("k", 8, s(b"\xc3\x28"))]),
     ["key 'k'", "not valid UTF-8"]),
    ("invalid_utf8_in_array",
     lambda: base_file(kvs=[kv("tok", 9, struct.pack("<IQ", 8, 2) + s("a") + s(b"\xe2\x82"))]),
     ["string 1 of array 'tok'", "not valid UTF-8"]),
    ("invalid_utf8_tensor_name",
     lambda: base_file(infos=[ti(b"\xff", (32, 2), 0, 0)]),
     ["name of tensor 0", "not valid UTF-8"]),
    ("q2_0_neither", lambda: _q2_last(16, 256, 200),
     ["Q2_0 tensor 'q2'", "matches neither", "1088", "1152"]),
    ("q2_0_ambiguous", lambda: _q2_last(1, 128, 0),
     ["Q2_0 tensor 'q2'", "ambiguous", "34", "36"]),
    ("q2_0_not_multiple_of_64",
     lambda: base_file(infos=[ti("q2", (96, 2), 42, 0)]),
     ["tensor 'q2'", "not a multiple of the block size 64"]),
]


@pytest.mark.parametrize("build, phrases", [(b, p) for _, b, p in MALFORMED],
                         ids=[i for i, _, _ in MALFORMED])
def test_malformed_file_is_refused(tmp_path: Path, build, phrases: list[str]) -> None:
    path = write_bytes(tmp_path, build(), "bad.gguf")
    with pytest.raises(GGUFError) as exc:
        GGUFReader(path)
    message = str(exc.value)
    assert str(path) in message
    for phrase in phrases:
        assert phrase in message, (phrase, message)


def test_base_file_of_malformed_corpus_is_valid(tmp_path: Path) -> None:
    """The corpus' starting point must itself be accepted (else the cases prove nothing)."""
    path = write_bytes(tmp_path, base_file())
    with GGUFReader(path) as r:
        assert list(r.tensors) == ["a", "b"]
        assert r.raw("b").tobytes() == bytes(range(136))
    path = write_bytes(tmp_path, _q2_last(16, 256, 0), "q2.gguf")
    with GGUFReader(path) as r:
        assert r.tensors["q2"].layout.block_size == 64


@pytest.mark.parametrize("kind", ["missing", "directory", "empty"])
def test_unopenable_paths(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "model.gguf"
    if kind == "directory":
        path.mkdir()
    elif kind == "empty":
        path.write_bytes(b"")
    phrase = {"missing": "no such file", "directory": "is a directory",
              "empty": "the file is empty"}[kind]
    with pytest.raises(GGUFError) as exc:
        GGUFReader(path)
    assert str(path) in str(exc.value)
    assert phrase in str(exc.value)
