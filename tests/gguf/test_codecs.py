"""Tests of the numpy and torch block codecs (vllm_prism.gguf.codecs / codecs_torch).

Expected values come from hand-worked bytes (derived in the comments from section 1 of
the Bonsai 2 GGUF spec) or from the slow pure-Python reference decoder/encoder below,
which is written straight from the spec's formulas, never from the code under test.
"""

from __future__ import annotations

import itertools
import struct

import numpy as np
import pytest
import torch

from vllm_prism.gguf import codecs, codecs_torch
from vllm_prism.gguf.constants import GGMLType
from vllm_prism.gguf.errors import GGUFError

# (type, group argument, elements per block, bytes per block)
FORMATS = [
    pytest.param(GGMLType.PQ2_0, None, 128, 34, id="PQ2_0"),
    pytest.param(GGMLType.Q2_0, None, 128, 34, id="Q2_0-g128"),
    pytest.param(GGMLType.Q2_0, 64, 64, 18, id="Q2_0-g64"),
    pytest.param(GGMLType.Q1_0, None, 128, 18, id="Q1_0"),
    pytest.param(GGMLType.PTQ1_0, None, 128, 28, id="PTQ1_0"),
]
ALL_VALUES = {  # legal q values per format
    GGMLType.PQ2_0: (-1, 0, 1, 2),
    GGMLType.Q2_0: (-1, 0, 1, 2),
    GGMLType.Q1_0: (-1, 1),
    GGMLType.PTQ1_0: (-1, 0, 1),
}
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]  # conftest skips without CUDA


# --------------------------------------------------------------- reference (spec text)


def ptq1_location(j: int) -> tuple[str, int, int]:
    """(array, byte index, digit n) holding element j of a PTQ1_0 block (spec section 1)."""
    if j < 80:  # element 16n + m is digit n of qs[m]
        n, m = divmod(j, 16)
        return "qs", m, n
    if j < 120:  # element 80 + 8n + m is digit n of qs[16 + m]
        n, m = divmod(j - 80, 8)
        return "qs", 16 + m, n
    n, h = divmod(j - 120, 2)  # element 120 + 2n + h is digit n of qh[h]
    return "qh", h, n


def ref_decode_block(block: bytes, fmt: GGMLType) -> tuple[list[int], float]:
    """Slow decoder of one block, straight from the spec."""
    if fmt == GGMLType.PTQ1_0:
        qs, qh = block[0:24], block[24:26]
        (d,) = struct.unpack("<e", block[26:28])
        q = []
        for j in range(128):
            where, idx, n = ptq1_location(j)
            b = (qs if where == "qs" else qh)[idx]
            q.append((((b * 3**n) % 256) * 3 >> 8) - 1)
        return q, d
    (d,) = struct.unpack("<e", block[0:2])
    qs = block[2:]
    if fmt == GGMLType.Q1_0:
        return [1 if (qs[j // 8] >> (j % 8)) & 1 else -1 for j in range(8 * len(qs))], d
    return [((qs[j // 4] >> (2 * (j % 4))) & 3) - 1 for j in range(4 * len(qs))], d


def ref_encode_block(q: list[int], d: float, fmt: GGMLType) -> bytes:
    """Slow encoder of one block, straight from the spec."""
    d_bytes = struct.pack("<e", d)
    if fmt == GGMLType.PTQ1_0:
        qs_trits = [[0] * 5 for _ in range(24)]
        qh_trits = [[0] * 5 for _ in range(2)]  # 4 trits, then a 0 digit: Q = 3 * Q4
        for j, v in enumerate(q):
            where, idx, n = ptq1_location(j)
            (qs_trits if where == "qs" else qh_trits)[idx][n] = v + 1
        out = bytearray()
        for digits in qs_trits + qh_trits:
            value = sum(t * 3 ** (4 - n) for n, t in enumerate(digits))
            out.append(-(-value * 256 // 243))  # ceil(Q * 256 / 243)
        return bytes(out) + d_bytes
    if fmt == GGMLType.Q1_0:
        out = bytearray(len(q) // 8)
        for j, v in enumerate(q):
            out[j // 8] |= (v > 0) << (j % 8)
        return d_bytes + bytes(out)
    out = bytearray(len(q) // 4)
    for j, v in enumerate(q):
        out[j // 4] |= (v + 1) << (2 * (j % 4))
    return d_bytes + bytes(out)


def random_qd(rng: np.random.Generator, fmt: GGMLType, lead: tuple[int, ...],
              n_blocks: int, group: int) -> tuple[np.ndarray, np.ndarray]:
    q = rng.choice(np.array(ALL_VALUES[fmt], np.int8), size=(*lead, n_blocks * group))
    # Any finite fp16 bit pattern (exponent field != 31), including zeros and subnormals.
    bits = rng.integers(0, 1 << 16, size=(*lead, n_blocks), dtype=np.uint16)
    bits[(bits & 0x7C00) == 0x7C00] ^= 0x4000
    return q, bits.view(np.float16)


def fp16_bits(d: np.ndarray | torch.Tensor) -> np.ndarray:
    if isinstance(d, torch.Tensor):
        d = d.cpu().numpy()
    return np.asarray(d, np.float16).view(np.uint16)


# ------------------------------------------------------------ hand-worked test vectors

# PQ2_0, one row of two blocks. Element j has code (qs[j//4] >> 2*(j%4)) & 3, q = code-1.
# Block 0, d = 1.0 = fp16 0x3C00 -> bytes 00 3C (little-endian), then qs:
#   qs[0]: elements 0..3 q (-1, 0, +1, +2) -> codes (0,1,2,3) -> 0 | 1<<2 | 2<<4 | 3<<6
#          = 0 + 4 + 32 + 192 = 228 = 0xE4
#   qs[1]: elements 4..7 q (+2, +1, 0, -1) -> codes (3,2,1,0) -> 3 + 2*4 + 1*16 = 27 = 0x1B
#   qs[2]: elements 8..11 q 0 -> code 1 in every field -> 0b01010101 = 0x55
#   qs[3]: elements 12..15 q +2 -> code 3 everywhere -> 0xFF (code 3 must decode as +2)
#   qs[4]: elements 16..19 q -1 -> code 0 -> 0x00
#   qs[5]: elements 20..23 q +1 -> code 2 -> 0b10101010 = 0xAA
#   qs[6..30]: elements 24..123 q 0 -> 0x55 (25 bytes)
#   qs[31]: elements 124..127 q (+1, -1, -1, 0) -> codes (2,0,0,1) -> 2 + 1<<6 = 66 = 0x42
# Block 1, d = 0.5 = fp16 0x3800 -> bytes 00 38; every q = +2 (code 3) -> qs all 0xFF,
# so every weight of block 1 is 2 * 0.5 = 1.0.
PQ2_BLOCK0 = bytes([0x00, 0x3C, 0xE4, 0x1B, 0x55, 0xFF, 0x00, 0xAA]) + b"\x55" * 25 + b"\x42"
PQ2_BLOCK1 = bytes([0x00, 0x38]) + b"\xFF" * 32
PQ2_Q0 = ([-1, 0, 1, 2, 2, 1, 0, -1] + [0] * 4 + [2] * 4 + [-1] * 4 + [1] * 4 + [0] * 100
          + [1, -1, -1, 0])
PQ2_ROW = PQ2_BLOCK0 + PQ2_BLOCK1
PQ2_Q = PQ2_Q0 + [2] * 128
PQ2_D = [1.0, 0.5]
PQ2_W = [float(v) for v in PQ2_Q0] + [1.0] * 128

# Q2_0 group 64, one block of 18 bytes: d = 2.0 = fp16 0x4000 -> bytes 00 40, then 16 qs:
#   qs[0]: elements 0..3 q (0, +1, +2, -1) -> codes (1,2,3,0) -> 1 + 2*4 + 3*16 = 57 = 0x39
#   qs[1..14]: elements 4..59 q +1 -> code 2 -> 0xAA (14 bytes)
#   qs[15]: elements 60..63 q (-1, -1, -1, +2) -> codes (0,0,0,3) -> 3<<6 = 192 = 0xC0
Q2G64_BLOCK = bytes([0x00, 0x40, 0x39]) + b"\xAA" * 14 + b"\xC0"
Q2G64_Q = [0, 1, 2, -1] + [1] * 56 + [-1, -1, -1, 2]
Q2G64_W = [2.0 * v for v in Q2G64_Q]

# Q1_0, one block of 18 bytes: d = 0.25 = 2^-2 -> fp16 exponent field 15 - 2 = 13,
# 13 << 10 = 0x3400 -> bytes 00 34. Element j is bit j%8 (LSB first) of qs[j//8];
# bit 1 -> +d, bit 0 -> -d.
#   qs[0]: elements 0..7 signs (+,-,-,-,-,-,-,-) -> bit 0 only -> 0x01
#   qs[1]: elements 8..15 signs (-,-,-,-,-,-,-,+) -> bit 7 only -> 0x80
#   qs[2]: elements 16..23 signs (+,-,+,-,+,-,+,-) -> bits 0,2,4,6 -> 0x55
#   qs[3..14]: elements 24..119 all + -> 0xFF (12 bytes)
#   qs[15]: elements 120..127 all - -> 0x00
Q1_BLOCK = bytes([0x00, 0x34, 0x01, 0x80, 0x55]) + b"\xFF" * 12 + b"\x00"
Q1_Q = [1] + [-1] * 7 + [-1] * 7 + [1] + [1, -1] * 4 + [1] * 96 + [-1] * 8
Q1_W = [0.25 * v for v in Q1_Q]

# PTQ1_0, one block of 28 bytes: qs[0..23], qh[0..1], then d. Trit t = q + 1.
# Where elements live (spec: 16n+m -> digit n of qs[m]; 80+8n+m -> digit n of qs[16+m];
# 120+2n+h -> digit n of qh[h]; digit 0 is the most significant):
#   element 0 -> qs[0] digit 0      element 1 -> qs[1] digit 0    element 15 -> qs[15] d0
#   element 16 -> qs[0] digit 1     element 79 = 16*4+15 -> qs[15] digit 4
#   element 80 -> qs[16] digit 0    element 87 -> qs[23] digit 0  element 88 -> qs[16] d1
#   element 119 = 80+8*4+7 -> qs[23] digit 4
#   element 120 -> qh[0] digit 0    element 121 -> qh[1] digit 0
#   element 127 = 120+2*3+1 -> qh[1] digit 3
# A byte stores ceil(Q*256/243) for the 5-trit number Q; qh holds Q = 3*Q4 (Q4 = 4 trits).
# Default q = 0 (t = 1):
#   5 trits 1,1,1,1,1: Q = 81+27+9+3+1 = 121; 121*256 = 30976; 243*127 = 30861 < 30976
#   -> ceil = 128 = 0x80 (qs[4..14], qs[17..22])
# Chosen bytes:
#   qs[0]: elements (0,16,32,48,64) t = (2,0,0,0,0), i.e. q[0]=+1, q[16,32,48,64]=-1:
#          Q = 2*81 = 162; 162*256 = 41472; 41472/243 = 170.67 -> 171 = 0xAB
#   qs[1]: elements (1,17,33,49,65) t = (0,1,1,1,1), q[1]=-1: Q = 27+9+3+1 = 40;
#          40*256 = 10240; 243*42 = 10206 < 10240 -> 43 = 0x2B
#   qs[2]: elements (2,18,34,50,66) all q=+1, t = 2: Q = 242; 242*256 = 61952;
#          61952/243 = 254.95 -> 255 = 0xFF
#   qs[3]: elements (3,19,35,51,67) all q=-1, t = 0: Q = 0 -> 0x00
#   qs[15]: elements (15,31,47,63,79) t = (2,1,1,1,0), q[15]=+1, q[79]=-1:
#          Q = 162+27+9+3 = 201; 201*256 = 51456; 243*211 = 51273 < 51456 -> 212 = 0xD4
#   qs[16]: elements (80,88,96,104,112) t = (2,2,1,1,1), q[80]=q[88]=+1:
#          Q = 162+54+9+3+1 = 229; 229*256 = 58624; 243*241 = 58563 < 58624 -> 242 = 0xF2
#   qs[23]: elements (87,95,103,111,119) t = (0,1,1,1,2), q[87]=-1, q[119]=+1:
#          Q = 27+9+3+2 = 41; 41*256 = 10496; 243*43 = 10449 < 10496 -> 44 = 0x2C
#   qh[0]: elements (120,122,124,126) t = (2,1,0,2): Q4 = 54+9+0+2 = 65, Q = 195;
#          195*256 = 49920; 243*205 = 49815 < 49920 -> 206 = 0xCE
#   qh[1]: elements (121,123,125,127) t = (0,1,1,0): Q4 = 9+3 = 12, Q = 36;
#          36*256 = 9216; 243*37 = 8991 < 9216 -> 38 = 0x26
#   Decoding checks: 171*3 = 513, >>8 = 2 (digit 0 of qs[0]); (171*3 mod 256)*3 = 3 -> 0.
#                    206*3 = 618 >> 8 = 2; 618 mod 256 = 106, 106*3 = 318 >> 8 = 1;
#                    206*9 mod 256 = 62, 62*3 = 186 >> 8 = 0; 206*27 mod 256 = 186,
#                    186*3 = 558 >> 8 = 2 -> (2,1,0,2) as intended.
# d = -1.5: 1.5 = 1.1b * 2^0 -> exponent 15 (0x3C00) + mantissa 0x200 + sign 0x8000
#   = 0xBE00 -> bytes 00 BE, LAST.
PTQ1_BLOCK = (bytes([0xAB, 0x2B, 0xFF, 0x00]) + b"\x80" * 11 + bytes([0xD4, 0xF2])
              + b"\x80" * 6 + bytes([0x2C, 0xCE, 0x26, 0x00, 0xBE]))


def _ptq1_expected_q() -> list[int]:
    q = [0] * 128
    q[0] = 1
    q[16] = q[32] = q[48] = q[64] = -1
    q[1] = -1
    for j in (2, 18, 34, 50, 66):
        q[j] = 1
    for j in (3, 19, 35, 51, 67):
        q[j] = -1
    q[15], q[79] = 1, -1
    q[80] = q[88] = 1
    q[87], q[119] = -1, 1
    q[120], q[122], q[124], q[126] = 1, 0, -1, 1
    q[121], q[127] = -1, -1
    return q


PTQ1_Q = _ptq1_expected_q()
PTQ1_W = [-1.5 * v for v in PTQ1_Q]

HAND_VECTORS = [
    pytest.param(GGMLType.PQ2_0, None, PQ2_ROW, PQ2_Q, PQ2_D, PQ2_W, id="PQ2_0"),
    pytest.param(GGMLType.Q2_0, None, PQ2_ROW, PQ2_Q, PQ2_D, PQ2_W, id="Q2_0-g128"),
    pytest.param(GGMLType.Q2_0, 64, Q2G64_BLOCK, Q2G64_Q, [2.0], Q2G64_W, id="Q2_0-g64"),
    pytest.param(GGMLType.Q1_0, None, Q1_BLOCK, Q1_Q, [0.25], Q1_W, id="Q1_0"),
    pytest.param(GGMLType.PTQ1_0, None, PTQ1_BLOCK, PTQ1_Q, [-1.5], PTQ1_W, id="PTQ1_0"),
]


def test_hand_vector_lengths() -> None:
    assert len(PQ2_BLOCK0) == len(PQ2_BLOCK1) == 34 and len(PQ2_Q0) == 128
    assert len(Q2G64_BLOCK) == 18 and len(Q2G64_Q) == 64
    assert len(Q1_BLOCK) == 18 and len(Q1_Q) == 128
    assert len(PTQ1_BLOCK) == 28


@pytest.mark.parametrize("fmt,group,raw,q,d,w", HAND_VECTORS)
def test_hand_vector_numpy(fmt, group, raw, q, d, w) -> None:
    raw_np = np.frombuffer(raw, np.uint8)
    q_got, d_got = codecs.unpack_blocks(raw_np, fmt, group=group)
    assert q_got.dtype == np.int8 and d_got.dtype == np.float16
    assert q_got.tolist() == q
    assert d_got.tolist() == d
    packed = codecs.pack_blocks(np.array(q, np.int8), np.array(d, np.float16), fmt,
                                group=group)
    assert packed.dtype == np.uint8 and packed.tobytes() == raw
    w_got = codecs.dequantize(raw_np, fmt, group=group)
    assert w_got.dtype == np.float32 and w_got.tolist() == w


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt,group,raw,q,d,w", HAND_VECTORS)
def test_hand_vector_torch(fmt, group, raw, q, d, w, device) -> None:
    raw_t = torch.tensor(list(raw), dtype=torch.uint8, device=device)
    q_got, d_got = codecs_torch.unpack_blocks(raw_t, fmt, group=group)
    assert q_got.dtype == torch.int8 and d_got.dtype == torch.float16
    assert q_got.device == raw_t.device
    assert q_got.tolist() == q and d_got.tolist() == d
    packed = codecs_torch.pack_blocks(torch.tensor(q, dtype=torch.int8, device=device),
                                      torch.tensor(d, dtype=torch.float16, device=device),
                                      fmt, group=group)
    assert packed.dtype == torch.uint8 and bytes(packed.cpu().tolist()) == raw
    assert codecs_torch.dequantize(raw_t, fmt, group=group).tolist() == w
    bf16 = codecs_torch.dequantize_to(raw_t, fmt, torch.bfloat16, group=group)
    assert bf16.dtype == torch.bfloat16 and bf16.float().tolist() == w  # all exact in bf16


@pytest.mark.parametrize("fmt,group,raw,q,d,w", HAND_VECTORS)
def test_hand_vector_matches_reference_decoder(fmt, group, raw, q, d, w) -> None:
    """The slow spec decoder agrees with the hand derivation (checks the test itself)."""
    size = 18 if group == 64 or fmt == GGMLType.Q1_0 else (28 if fmt == GGMLType.PTQ1_0
                                                           else 34)
    q_ref: list[int] = []
    d_ref: list[float] = []
    for start in range(0, len(raw), size):
        q_block, d_block = ref_decode_block(raw[start:start + size], fmt)
        assert ref_encode_block(q_block, d_block, fmt) == raw[start:start + size]
        q_ref += q_block
        d_ref.append(d_block)
    assert q_ref == q and d_ref == d


def test_hand_vector_multi_dim_rows() -> None:
    """Leading dimensions are rows: [2, 3] rows of the PQ2_0 two-block row."""
    raw = np.tile(np.frombuffer(PQ2_ROW, np.uint8), (2, 3, 1))
    q, d = codecs.unpack_blocks(raw, GGMLType.PQ2_0)
    assert q.shape == (2, 3, 256) and d.shape == (2, 3, 2)
    assert (q == np.array(PQ2_Q, np.int8)).all() and (d == np.array(PQ2_D)).all()
    assert codecs.dequantize(raw, GGMLType.PQ2_0).shape == (2, 3, 256)
    q_t, d_t = codecs_torch.unpack_blocks(torch.from_numpy(raw), GGMLType.PQ2_0)
    assert q_t.shape == (2, 3, 256) and d_t.shape == (2, 3, 2)


# ------------------------------------------------------- PTQ1_0 exhaustive trit patterns


def _ptq1_blocks_with_byte_patterns(where: str, idx: int, n_digits: int) -> tuple:
    """One block per trit pattern of the given byte; other elements q = 0."""
    patterns = list(itertools.product(range(3), repeat=n_digits))
    q = np.zeros((len(patterns), 128), np.int8)
    elements = [j for j in range(128) if ptq1_location(j)[:2] == (where, idx)]
    elements.sort(key=lambda j: ptq1_location(j)[2])  # by digit n
    assert len(elements) == n_digits
    for row, pattern in enumerate(patterns):
        q[row, elements] = np.array(pattern) - 1
    return patterns, q


@pytest.mark.parametrize("where,idx,n_digits,offset",
                         [("qs", 0, 5, 0), ("qs", 21, 5, 21), ("qh", 1, 4, 25)])
def test_ptq1_all_trit_patterns(where, idx, n_digits, offset) -> None:
    patterns, q = _ptq1_blocks_with_byte_patterns(where, idx, n_digits)
    d = np.ones((len(patterns), 1), np.float16)
    raw = codecs.pack_blocks(q, d, GGMLType.PTQ1_0)
    for row, pattern in enumerate(patterns):
        digits = list(pattern) + [0] * (5 - n_digits)
        value = sum(t * 3 ** (4 - n) for n, t in enumerate(digits))
        assert raw[row, offset] == -(-value * 256 // 243)
    q_back, _ = codecs.unpack_blocks(raw, GGMLType.PTQ1_0)
    np.testing.assert_array_equal(q_back, q)
    q_t, _ = codecs_torch.unpack_blocks(torch.from_numpy(raw), GGMLType.PTQ1_0)
    np.testing.assert_array_equal(q_t.numpy(), q)
    raw_t = codecs_torch.pack_blocks(torch.from_numpy(q), torch.from_numpy(d),
                                     GGMLType.PTQ1_0)
    np.testing.assert_array_equal(raw_t.numpy(), raw)


# -------------------------------------------------------------- random bit-exact trips


@pytest.mark.parametrize("lead", [(), (3,), (2, 3)])
@pytest.mark.parametrize("fmt,group,block,size", FORMATS)
def test_random_round_trip_numpy_vs_reference(fmt, group, block, size, lead) -> None:
    rng = np.random.default_rng(1234 + int(fmt) + len(lead))
    q, d = random_qd(rng, fmt, lead, 4, block)
    raw = codecs.pack_blocks(q, d, fmt, group=group)
    assert raw.shape == (*lead, 4 * size) and raw.dtype == np.uint8
    # bytes agree with the slow spec encoder, block by block
    flat_q = q.reshape(-1, block)
    flat_d = d.reshape(-1)
    expected = b"".join(ref_encode_block(flat_q[i].tolist(), float(flat_d[i]), fmt)
                        for i in range(flat_q.shape[0]))
    assert raw.tobytes() == expected
    q_back, d_back = codecs.unpack_blocks(raw, fmt, group=group)
    np.testing.assert_array_equal(q_back, q)
    np.testing.assert_array_equal(fp16_bits(d_back), fp16_bits(d))
    assert q_back.shape == q.shape and d_back.shape == d.shape


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt,group,block,size", FORMATS)
def test_random_round_trip_torch_matches_numpy(fmt, group, block, size, device) -> None:
    rng = np.random.default_rng(99 + int(fmt))
    q, d = random_qd(rng, fmt, (5, 2), 3, block)
    raw = codecs.pack_blocks(q, d, fmt, group=group)
    raw_t = codecs_torch.pack_blocks(torch.from_numpy(q).to(device),
                                     torch.from_numpy(d).to(device), fmt, group=group)
    np.testing.assert_array_equal(raw_t.cpu().numpy(), raw)
    q_t, d_t = codecs_torch.unpack_blocks(raw_t, fmt, group=group)
    np.testing.assert_array_equal(q_t.cpu().numpy(), q)
    np.testing.assert_array_equal(fp16_bits(d_t), fp16_bits(d))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt,group,block,size", FORMATS)
def test_arbitrary_bytes_decode_same_everywhere(fmt, group, block, size, device) -> None:
    """Any byte string (not only canonical encodings) decodes identically in numpy, torch
    and the spec decoder; dequantize is q * d computed independently."""
    rng = np.random.default_rng(7 + int(fmt))
    raw = rng.integers(0, 256, size=(4, 3 * size), dtype=np.uint8)
    raw[:, 1::size] &= 0xBB  # keep the fp16 d finite wherever it sits in the block
    raw[:, size - 1::size] &= 0xBB
    q, d = codecs.unpack_blocks(raw, fmt, group=group)
    w = codecs.dequantize(raw, fmt, group=group)
    q_t, d_t = codecs_torch.unpack_blocks(torch.from_numpy(raw).to(device), fmt, group=group)
    w_t = codecs_torch.dequantize(torch.from_numpy(raw).to(device), fmt, group=group)
    np.testing.assert_array_equal(q_t.cpu().numpy(), q)
    np.testing.assert_array_equal(fp16_bits(d_t), fp16_bits(d))
    np.testing.assert_array_equal(w_t.cpu().numpy(), w)
    for r in range(raw.shape[0]):
        for b in range(3):
            q_ref, d_ref = ref_decode_block(raw[r, b * size:(b + 1) * size].tobytes(), fmt)
            assert q[r, b * block:(b + 1) * block].tolist() == q_ref
            assert np.isfinite(d_ref) and float(d[r, b]) == d_ref
            w_ref = [v * d_ref for v in q_ref]  # python float: exact for these products
            assert w[r, b * block:(b + 1) * block].tolist() == w_ref


@pytest.mark.parametrize("fmt,group,block,size", FORMATS)
def test_dequantize_is_q_times_d(fmt, group, block, size) -> None:
    rng = np.random.default_rng(5)
    q = rng.choice(np.array(ALL_VALUES[fmt], np.int8), size=(6, 2 * block))
    d = (rng.standard_normal((6, 2)) * 0.03).astype(np.float16)
    raw = codecs.pack_blocks(q, d, fmt, group=group)
    expected = q.astype(np.float64) * np.repeat(d.astype(np.float64), block, axis=-1)
    np.testing.assert_array_equal(codecs.dequantize(raw, fmt, group=group), expected)
    got_t = codecs_torch.dequantize(torch.from_numpy(raw), fmt, group=group)
    assert got_t.dtype == torch.float32
    np.testing.assert_array_equal(got_t.numpy(), expected)


# ---------------------------------------------------------------- float types and Q8_0


def test_dequantize_float_types() -> None:
    f32 = np.array([[1.5, -2.0], [0.0, 3.25]], np.float32)
    np.testing.assert_array_equal(codecs.dequantize(f32, GGMLType.F32), f32)
    np.testing.assert_array_equal(
        codecs.dequantize(f32.view(np.uint8), GGMLType.F32), f32)
    f16 = np.array([0.5, -65504.0], np.float16)
    np.testing.assert_array_equal(codecs.dequantize(f16, GGMLType.F16), [0.5, -65504.0])
    # bf16 bits: 0x3F80 = 1.0, 0xC000 = -2.0, 0x4049 = 0 10000000 1001001 = 3.140625
    bf16 = np.array([0x3F80, 0xC000, 0x4049], np.uint16)
    assert codecs.dequantize(bf16, GGMLType.BF16).tolist() == [1.0, -2.0, 3.140625]
    assert codecs.dequantize(bytes_u8([0x80, 0x3F, 0x00, 0xC0]),
                             GGMLType.BF16).tolist() == [1.0, -2.0]
    t_bf16 = torch.tensor([1.0, -2.0, 3.140625], dtype=torch.bfloat16)
    assert codecs_torch.dequantize(t_bf16, GGMLType.BF16).tolist() == [1.0, -2.0, 3.140625]
    assert codecs_torch.dequantize(torch.from_numpy(bf16.view(np.int16)),
                                   GGMLType.BF16).tolist() == [1.0, -2.0, 3.140625]
    assert codecs_torch.dequantize(torch.from_numpy(f32.view(np.uint8)),
                                   GGMLType.F32).tolist() == f32.tolist()
    assert codecs_torch.dequantize_to(torch.from_numpy(f16), GGMLType.F16,
                                      torch.float16).dtype == torch.float16


def bytes_u8(values: list[int]) -> np.ndarray:
    return np.array(values, np.uint8)


def test_dequantize_q8_0_hand_vector() -> None:
    # d = 0.5 = fp16 0x3800 -> bytes 00 38; then 32 int8: -128 (0x80), 127 (0x7F), 0, 1,
    # -1 (0xFF), then 27 zeros. Weights: -64, 63.5, 0, 0.5, -0.5, 0...
    raw = bytes_u8([0x00, 0x38, 0x80, 0x7F, 0x00, 0x01, 0xFF] + [0] * 27)
    expected = [-64.0, 63.5, 0.0, 0.5, -0.5] + [0.0] * 27
    assert codecs.dequantize(raw, GGMLType.Q8_0).tolist() == expected
    assert codecs_torch.dequantize(torch.from_numpy(raw), GGMLType.Q8_0).tolist() == expected
    q, d = codecs.unpack_blocks(raw, GGMLType.Q8_0)
    assert codecs.pack_blocks(q, d, GGMLType.Q8_0).tobytes() == raw.tobytes()


# ---------------------------------------------------------------- reference quantizer


@pytest.mark.parametrize("fmt,group,block,size", FORMATS)
def test_quantize_recovers_exact_ternary_multiples(fmt, group, block, size) -> None:
    rng = np.random.default_rng(11)
    q = rng.choice(np.array([v for v in ALL_VALUES[fmt] if v in (-1, 0, 1)], np.int8),
                   size=(4, 3 * block))
    q[..., ::block] = 1  # every group has a +1, so max|x| = d
    d = rng.uniform(0.01, 2.0, size=(4, 3)).astype(np.float16)
    x = (q.astype(np.float32) * np.repeat(d.astype(np.float32), block, axis=-1))
    q_np, d_np = codecs.quantize_ternary(x, fmt, group=group)
    np.testing.assert_array_equal(q_np, q)
    np.testing.assert_array_equal(fp16_bits(d_np), fp16_bits(d))
    q_t, d_t = codecs_torch.quantize_ternary(torch.from_numpy(x), fmt, group=group)
    np.testing.assert_array_equal(q_t.numpy(), q)
    np.testing.assert_array_equal(fp16_bits(d_t), fp16_bits(d))


@pytest.mark.parametrize("fmt,group,block,size", FORMATS)
def test_quantize_all_zero_group(fmt, group, block, size) -> None:
    x = np.zeros((2, 2 * block), np.float32)
    x[1, :block] = 0.75  # second row: first group non-zero, second all zero
    zero_q = 1 if fmt == GGMLType.Q1_0 else 0
    for q, d in (codecs.quantize_ternary(x, fmt, group=group),
                 codecs_torch.quantize_ternary(torch.from_numpy(x), fmt, group=group)):
        q, d = np.asarray(q), np.asarray(d)
        assert d.tolist() == [[0.0, 0.0], [0.75, 0.0]]
        assert (q[0] == zero_q).all() and (q[1, block:] == zero_q).all()
        assert (q[1, :block] == 1).all()


def test_quantize_rounding_and_scale_rules() -> None:
    # PQ2_0 / PTQ1_0: d = max|x| = 2.0 (fp16 exact); x/d = 1, 0.5, -0.5, 0.25, -0.75, 0.
    # round half away from zero (llama.cpp lroundf): 0.5 -> 1, -0.5 -> -1, 0.25 -> 0,
    # -0.75 -> -1.
    x = np.zeros(128, np.float32)
    x[:6] = [2.0, 1.0, -1.0, 0.5, -1.5, 0.0]
    for fmt in (GGMLType.PQ2_0, GGMLType.PTQ1_0):
        for q, d in (codecs.quantize_ternary(x, fmt),
                     codecs_torch.quantize_ternary(torch.from_numpy(x), fmt)):
            assert np.asarray(q)[:6].tolist() == [1, 1, -1, 0, -1, 0]
            assert np.asarray(d).tolist() == [2.0]
    # Q1_0: d = mean|x| = (2 + 1 + 1 + 0.5 + 1.5) / 128 = 6/128 = 0.046875 (fp16 exact);
    # q = sign(x), +1 for x >= 0 (so the zeros at 5..127 give +1).
    for q, d in (codecs.quantize_ternary(x, GGMLType.Q1_0),
                 codecs_torch.quantize_ternary(torch.from_numpy(x), GGMLType.Q1_0)):
        assert np.asarray(q)[:6].tolist() == [1, 1, -1, 1, -1, 1]
        assert (np.asarray(q)[6:] == 1).all()
        assert np.asarray(d).tolist() == [0.046875]


@pytest.mark.parametrize("fmt,group,block,size", FORMATS)
def test_quantize_numpy_matches_torch(fmt, group, block, size) -> None:
    x = np.random.default_rng(3).standard_normal((8, 4 * block)).astype(np.float32)
    q, d = codecs.quantize_ternary(x, fmt, group=group)
    q_t, d_t = codecs_torch.quantize_ternary(torch.from_numpy(x), fmt, group=group)
    np.testing.assert_array_equal(q_t.numpy(), q)
    np.testing.assert_array_equal(fp16_bits(d_t), fp16_bits(d))
    assert set(np.unique(q).tolist()) <= set(ALL_VALUES[fmt])


# ----------------------------------------------------------------------------- errors


def _both_pack(q: np.ndarray, d: np.ndarray, fmt: GGMLType, group=None):
    yield lambda: codecs.pack_blocks(q, d, fmt, group=group)
    yield lambda: codecs_torch.pack_blocks(torch.from_numpy(q), torch.from_numpy(d), fmt,
                                           group=group)


@pytest.mark.parametrize("fmt,group,block,size", FORMATS)
def test_error_wrong_byte_length(fmt, group, block, size) -> None:
    raw = np.zeros((2, 2 * size + 1), np.uint8)
    name = fmt.name
    for call in (lambda: codecs.unpack_blocks(raw, fmt, group=group),
                 lambda: codecs.dequantize(raw, fmt, group=group),
                 lambda: codecs_torch.unpack_blocks(torch.from_numpy(raw), fmt, group=group),
                 lambda: codecs_torch.dequantize(torch.from_numpy(raw), fmt, group=group)):
        with pytest.raises(GGUFError, match=rf"{name}.*{2 * size + 1} bytes per row"):
            call()


@pytest.mark.parametrize("bad", [2, -2])
def test_error_ptq1_value_out_of_range(bad) -> None:
    q = np.zeros((1, 128), np.int8)
    q[0, 77] = bad
    d = np.ones((1, 1), np.float16)
    for call in _both_pack(q, d, GGMLType.PTQ1_0):
        with pytest.raises(GGUFError, match=r"PTQ1_0: q values must lie in \[-1, 1\]"):
            call()


@pytest.mark.parametrize("fmt,bad", [(GGMLType.PQ2_0, 3), (GGMLType.Q2_0, -2),
                                     (GGMLType.Q1_0, 0), (GGMLType.Q1_0, 2)])
def test_error_other_values_out_of_range(fmt, bad) -> None:
    q = np.ones((1, 128), np.int8)
    q[0, 5] = bad
    d = np.ones((1, 1), np.float16)
    for call in _both_pack(q, d, fmt):
        with pytest.raises(GGUFError, match=rf"{fmt.name}: q values must"):
            call()


@pytest.mark.parametrize("fmt,group,block,size", FORMATS)
def test_error_k_not_multiple_of_group(fmt, group, block, size) -> None:
    k = block + 32
    q = np.ones((2, k), np.int8)
    d = np.ones((2, 1), np.float16)
    pattern = rf"{fmt.name}.*K = {k} is not a multiple of the group size {block}"
    for call in _both_pack(q, d, fmt, group):
        with pytest.raises(GGUFError, match=pattern):
            call()
    x = np.ones((2, k), np.float32)
    with pytest.raises(GGUFError, match=pattern):
        codecs.quantize_ternary(x, fmt, group=group)
    with pytest.raises(GGUFError, match=pattern):
        codecs_torch.quantize_ternary(torch.from_numpy(x), fmt, group=group)


def test_error_misc() -> None:
    q = np.ones((2, 128), np.int8)
    with pytest.raises(GGUFError, match=r"PQ2_0: d has shape \(2, 2\), expected \(2, 1\)"):
        codecs.pack_blocks(q, np.ones((2, 2), np.float16), GGMLType.PQ2_0)
    with pytest.raises(GGUFError, match="Q2_0: group must be 128 or 64, got 32"):
        codecs.unpack_blocks(np.zeros(34, np.uint8), GGMLType.Q2_0, group=32)
    with pytest.raises(GGUFError, match="PTQ1_0: group is fixed at 128, got 64"):
        codecs.unpack_blocks(np.zeros(28, np.uint8), GGMLType.PTQ1_0, group=64)
    with pytest.raises(GGUFError, match="PQ2_0: raw data must be uint8"):
        codecs.unpack_blocks(np.zeros(34, np.int8), GGMLType.PQ2_0)
    with pytest.raises(GGUFError, match="PQ2_0: raw data must be uint8"):
        codecs_torch.unpack_blocks(torch.zeros(34, dtype=torch.int8), GGMLType.PQ2_0)
    with pytest.raises(GGUFError, match="TQ1_0: the block codecs handle only"):
        codecs.dequantize(np.zeros(54, np.uint8), GGMLType.TQ1_0)
    with pytest.raises(GGUFError, match="unknown ggml tensor type 77"):
        codecs.dequantize(np.zeros(54, np.uint8), 77)
    with pytest.raises(GGUFError, match="Q8_0: quantize_ternary handles only"):
        codecs.quantize_ternary(np.zeros(32, np.float32), GGMLType.Q8_0)
    with pytest.raises(GGUFError, match="PQ2_0: q must be an integer"):
        codecs.pack_blocks(q.astype(np.float32), np.ones((2, 1), np.float16),
                           GGMLType.PQ2_0)
    with pytest.raises(GGUFError, match="F16: expected a float16 or uint8 array"):
        codecs.dequantize(np.zeros(4, np.float32), GGMLType.F16)
    with pytest.raises(GGUFError, match=r"Q2_0 \(group 64\): K = 96"):
        codecs.pack_blocks(np.ones(96, np.int8), np.ones(1, np.float16), GGMLType.Q2_0,
                           group=64)
