"""Fuzz tests of the GGUF reader: corrupt files fail with GGUFError, quickly.

Valid files are mutated (random bytes, truncation, huge counts spliced over small
integers of the header); opening the result must either succeed, and then every
tensor view must be readable, or raise GGUFError. Any other exception, or an open
that takes long (a crafted count making the reader loop or allocate), is a bug.
"""

from __future__ import annotations

import struct
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vllm_prism.gguf.constants import GGMLType, GGUFValueType
from vllm_prism.gguf.errors import GGUFError
from vllm_prism.gguf.reader import GGUFReader
from vllm_prism.gguf.writer import GGUFWriter

V = GGUFValueType
T = GGMLType
MAX_SECONDS = 2.0
HUGE = [2**64 - 1, 2**63, 2**62, 2**40, 2**32 - 1, 2**32, 2**31, 10**9, 0]


def _write_base(path: Path, version: int, alignment: int) -> None:
    rng = np.random.default_rng(version * 100 + alignment)
    w = GGUFWriter(path, version=version, alignment=alignment)
    w.add_metadata("general.architecture", "qwen3")
    w.add_metadata("qwen3.block_count", 2, V.UINT32)
    w.add_metadata("qwen3.eps", 1e-6, V.FLOAT32)
    w.add_metadata("flag", True)
    w.add_metadata("big", 2**63, V.UINT64)
    w.add_metadata("f64", 0.5, V.FLOAT64)
    w.add_metadata("tokens", ["<s>", "a", "\u00e9", ""], V.ARRAY, V.STRING)
    w.add_metadata("scores", [0.0, -1.0, 2.5, 3.0], V.ARRAY, V.FLOAT32)
    w.add_metadata("types", [1, 2, 3, 4], V.ARRAY, V.INT32)
    w.add_metadata("u8s", [1, 2, 3], V.ARRAY, V.UINT8)
    w.add_metadata("nested", [[1, 2], [3]], V.ARRAY, (V.ARRAY, V.UINT16))
    w.add_metadata("empty", [], V.ARRAY, V.INT64)
    w.add_tensor("norm", rng.standard_normal(8).astype(np.float32), T.F32)
    w.add_tensor("h", rng.standard_normal((2, 4)).astype(np.float16), T.F16)
    w.add_tensor("b", rng.integers(0, 2**16, (2, 4), dtype=np.uint16), T.BF16)
    w.add_tensor("q8", rng.integers(0, 256, 2 * 34, dtype=np.uint8), T.Q8_0,
                 shape=(2, 32))
    w.add_tensor("pq2", rng.integers(0, 256, 34, dtype=np.uint8), T.PQ2_0,
                 shape=(1, 128))
    w.add_tensor("ptq1", rng.integers(0, 256, 28, dtype=np.uint8), T.PTQ1_0,
                 shape=(1, 128))
    w.add_tensor("q2_128", rng.integers(0, 256, 32 * 34, dtype=np.uint8), T.Q2_0,
                 shape=(32, 128), q2_0_group=128)
    w.add_tensor("q2_64", rng.integers(0, 256, 32 * 2 * 18, dtype=np.uint8), T.Q2_0,
                 shape=(32, 128), q2_0_group=64)
    w.write()


def _count_like_positions(data: bytes, header_end: int) -> list[int]:
    """Header positions holding a small nonzero u64 or u32 (lengths, counts, dims...)."""
    positions = []
    for pos in range(0, header_end - 3):
        (v32,) = struct.unpack_from("<I", data, pos)
        if 0 < v32 < 2**16:
            positions.append(pos)
    return positions


@pytest.fixture(scope="module")
def bases(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[bytes, int, list[int]]]:
    """(file bytes, header length, count-like positions) of a few valid files."""
    out = []
    root = tmp_path_factory.mktemp("bases")
    for version, alignment in [(3, 32), (2, 64), (3, 1)]:
        path = root / f"base_v{version}_a{alignment}.gguf"
        _write_base(path, version, alignment)
        with GGUFReader(path) as r:  # must be valid, else the fuzzing proves nothing
            assert len(r.tensors) == 8
            assert r.tensors["q2_64"].layout.block_size == 64
            assert r.tensors["q2_128"].layout.block_size == 128
            header_end = r.data_offset
        data = path.read_bytes()
        out.append((data, header_end, _count_like_positions(data, header_end)))
    return out


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz") / "mutant.gguf"


def _open_and_read_all(path: Path, data: bytes) -> None:
    """Open ``data``; a success must give readable views; only GGUFError may escape."""
    path.write_bytes(data)
    start = time.perf_counter()
    try:
        with GGUFReader(path) as r:
            for name, info in r.tensors.items():
                raw = r.raw(name)
                assert raw.nbytes == info.nbytes
                int(raw.sum(dtype=np.uint64))  # touch every byte
                t = r.tensor(name)
                assert t.nbytes == info.nbytes
                del raw, t
            repr(r.metadata)
    except GGUFError as e:
        assert str(path) in str(e)
    elapsed = time.perf_counter() - start
    assert elapsed < MAX_SECONDS, f"opening took {elapsed:.2f} s"


def _splice(data: bytearray, pos: int, value: int, width: int) -> None:
    chunk = value.to_bytes(8, "little")[:width]
    end = min(pos + width, len(data))
    data[pos:end] = chunk[:end - pos]


_MUTATION = st.one_of(
    st.tuples(st.just("byte"), st.integers(0, 2**20), st.integers(0, 255)),
    st.tuples(st.just("u64"), st.integers(0, 2**20),
              st.one_of(st.sampled_from(HUGE), st.integers(0, 2**64 - 1))),
    st.tuples(st.just("u32"), st.integers(0, 2**20),
              st.one_of(st.sampled_from([0, 1, 5, 9, 13, 42, 99, 142, 2**31, 2**32 - 1]),
                        st.integers(0, 2**32 - 1))),
    st.tuples(st.just("truncate"), st.integers(0, 2**20), st.just(0)),
)


@settings(max_examples=200, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_mutated_files_open_or_raise_gguf_error(bases, scratch: Path, data) -> None:
    base, header_end, counts = data.draw(st.sampled_from(bases), label="base")
    mutations = data.draw(st.lists(_MUTATION, min_size=1, max_size=4), label="mutations")
    # Most mutations hit the header, where the parsing is.
    in_header = data.draw(st.lists(st.booleans(), min_size=len(mutations),
                                   max_size=len(mutations)), label="in_header")
    blob = bytearray(base)
    for (kind, pos, value), header in zip(mutations, in_header, strict=True):
        if not blob:
            break
        if kind in ("u64", "u32") and header:
            pos = counts[pos % len(counts)]  # overwrite a length/count/dim/offset
        else:
            limit = min(header_end, len(blob)) if header else len(blob)
            pos %= max(limit, 1)
        if kind == "byte":
            blob[pos] = value
        elif kind == "u64":
            _splice(blob, pos, value, 8)
        elif kind == "u32":
            _splice(blob, pos, value, 4)
        else:
            del blob[pos:]
    _open_and_read_all(scratch, bytes(blob))


def test_every_truncation_opens_or_raises(bases, scratch: Path) -> None:
    base, header_end, _ = bases[0]
    for cut in list(range(0, header_end + 8)) + list(range(header_end + 8, len(base), 7)):
        _open_and_read_all(scratch, base[:cut])


@pytest.mark.parametrize("width", [4, 8])
def test_huge_value_at_every_count_like_position(bases, scratch: Path,
                                                 width: int) -> None:
    base, _, counts = bases[1]
    for pos in counts:
        for value in (2**64 - 1, 2**63, 2**40, 2**32 - 1):
            blob = bytearray(base)
            _splice(blob, pos, value, width)
            _open_and_read_all(scratch, bytes(blob))
