"""Tests for vllm_prism.gguf.hadamard: the folded block Hadamard rotation and its contract.

Expected values come from literals written here or from a dense Hadamard matrix built
here by the Sylvester Kronecker recursion, never from the module under test.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_prism.gguf.constants import GGUFValueType
from vllm_prism.gguf.errors import GGUFError
from vllm_prism.gguf.hadamard import (PRISM_KEYS, HadamardContract, block_hadamard,
                                      fold_embedding, fold_weight, forward_transform,
                                      hadamard_matrix, inverse_embedding_transform,
                                      make_contract, parse_hadamard_contract,
                                      primal_embedding, primal_weight)

PROPS = settings(derandomize=True, max_examples=40, deadline=None)

# ---------------------------------------------------------------------------
# Independent references
# ---------------------------------------------------------------------------


def sylvester(n: int) -> np.ndarray:
    """Normalized Sylvester matrix by H_2n = kron([[1, 1], [1, -1]], H_n)."""
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.kron(np.array([[1.0, 1.0], [1.0, -1.0]]), h)
    assert h.shape == (n, n)
    return h / math.sqrt(n)


def dense_block_diag(width: int, block: int) -> np.ndarray:
    return np.kron(np.eye(width // block), sylvester(block))


def rand_signs(rng: np.random.Generator, width: int) -> np.ndarray:
    return rng.choice(np.array([-1.0, 1.0]), size=width)


@st.composite
def problems(draw: st.DrawFn) -> tuple[int, int, int, np.random.Generator]:
    """(block, width, rows, rng) of a small random problem."""
    block = 2 ** draw(st.integers(0, 7))
    width = block * draw(st.integers(1, 4))
    rows = draw(st.integers(1, 5))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    return block, width, rows, rng


# ---------------------------------------------------------------------------
# hadamard_matrix
# ---------------------------------------------------------------------------


def test_hadamard_matrix_literal_2_and_4() -> None:
    r2 = 1 / math.sqrt(2)
    np.testing.assert_allclose(hadamard_matrix(2), [[r2, r2], [r2, -r2]], atol=1e-15)
    expected4 = 0.5 * np.array([[1, 1, 1, 1],
                                [1, -1, 1, -1],
                                [1, 1, -1, -1],
                                [1, -1, -1, 1]], dtype=float)
    np.testing.assert_allclose(hadamard_matrix(4), expected4, atol=1e-15)
    np.testing.assert_array_equal(hadamard_matrix(1), [[1.0]])


@pytest.mark.parametrize("n", [2**k for k in range(11)])
def test_hadamard_matrix_involution_symmetric_and_popcount(n: int) -> None:
    h = hadamard_matrix(n)
    assert h.shape == (n, n)
    np.testing.assert_allclose(h @ h, np.eye(n), atol=1e-12)
    np.testing.assert_array_equal(h, h.T)
    np.testing.assert_allclose(h, sylvester(n), atol=1e-15)
    r, c = np.random.default_rng(n).integers(0, n, size=(2, 64))
    for i, j in zip(r.tolist(), c.tolist()):
        assert h[i, j] == pytest.approx((-1) ** bin(i & j).count("1") / math.sqrt(n))


@pytest.mark.parametrize("n", [0, 3, 6, 1000, -4, True])
def test_hadamard_matrix_rejects_non_power_of_two(n: int) -> None:
    with pytest.raises(ValueError):
        hadamard_matrix(n)


# ---------------------------------------------------------------------------
# Transforms
# ---------------------------------------------------------------------------


@PROPS
@given(problems())
def test_block_hadamard_matches_dense_block_diagonal(p) -> None:
    block, width, rows, rng = p
    x = rng.standard_normal((rows, width))
    np.testing.assert_allclose(block_hadamard(x, block),
                               x @ dense_block_diag(width, block).T, atol=1e-12)


def test_block_hadamard_block_1024_two_chunks() -> None:
    x = np.random.default_rng(0).standard_normal((3, 2048))
    np.testing.assert_allclose(block_hadamard(x, 1024),
                               x @ dense_block_diag(2048, 1024).T, atol=1e-11)


def test_order_of_signs_and_transform_literal() -> None:
    """block 2, s = [1, -1], x = [1, 2]: checks which side the signs go on."""
    s = np.array([1.0, -1.0])
    x = np.array([1.0, 2.0])
    r2 = math.sqrt(2)
    # H(s * x) = H [1, -2] = [-1, 3] / sqrt 2
    np.testing.assert_allclose(forward_transform(x, s, 2), [-1 / r2, 3 / r2])
    np.testing.assert_allclose(fold_weight(x, s, 2), [-1 / r2, 3 / r2])
    np.testing.assert_allclose(fold_embedding(x, s, 2), [-1 / r2, 3 / r2])
    # s * H x = s * [3, -1] / sqrt 2 = [3, 1] / sqrt 2
    np.testing.assert_allclose(inverse_embedding_transform(x, s, 2), [3 / r2, 1 / r2])
    np.testing.assert_allclose(primal_weight(x, s, 2), [3 / r2, 1 / r2])
    np.testing.assert_allclose(primal_embedding(x, s, 2), [3 / r2, 1 / r2])


@PROPS
@given(problems())
def test_transforms_match_dense_definitions(p) -> None:
    block, width, rows, rng = p
    s = rand_signs(rng, width)
    hbd = dense_block_diag(width, block)
    x = rng.standard_normal((rows, width))
    # rows as column vectors: y = Hblk(s * x), h = s * Hblk(z)
    np.testing.assert_allclose(forward_transform(x, s, block), (x * s) @ hbd.T,
                               atol=1e-12)
    np.testing.assert_allclose(inverse_embedding_transform(x, s, block),
                               s * (x @ hbd.T), atol=1e-12)
    # y = W_st Hblk diag(s) x  =>  primal = W_st @ Hblk @ diag(s)
    np.testing.assert_allclose(primal_weight(x, s, block), x @ hbd @ np.diag(s),
                               atol=1e-12)


@PROPS
@given(problems())
def test_folded_linear_equals_primal_linear(p) -> None:
    block, width, rows, rng = p
    s = rand_signs(rng, width)
    w_st = rng.integers(-1, 2, size=(rows + 2, width)).astype(np.float64)
    x = rng.standard_normal((width, 3))
    folded = w_st @ forward_transform(x.T, s, block).T
    np.testing.assert_allclose(primal_weight(w_st, s, block) @ x, folded, atol=1e-10)


@PROPS
@given(problems())
def test_fold_and_primal_are_inverses(p) -> None:
    block, width, rows, rng = p
    s = rand_signs(rng, width)
    w = rng.standard_normal((rows, width))
    for fold, unfold in ((fold_weight, primal_weight), (fold_embedding, primal_embedding),
                         (forward_transform, inverse_embedding_transform)):
        np.testing.assert_allclose(unfold(fold(w, s, block), s, block), w, atol=1e-12)
        np.testing.assert_allclose(fold(unfold(w, s, block), s, block), w, atol=1e-12)
    np.testing.assert_allclose(block_hadamard(block_hadamard(w, block), block), w,
                               atol=1e-12)
    # A rotation preserves the norm of every row.
    np.testing.assert_allclose(np.linalg.norm(forward_transform(w, s, block), axis=-1),
                               np.linalg.norm(w, axis=-1), rtol=1e-12)


@PROPS
@given(problems())
def test_embedding_lookup_commutes_with_unfold(p) -> None:
    block, width, rows, rng = p
    s = rand_signs(rng, width)
    z_st = rng.standard_normal((rows + 3, width))
    table = primal_embedding(z_st, s, block)
    for t in range(z_st.shape[0]):
        np.testing.assert_allclose(table[t], inverse_embedding_transform(z_st[t], s, block),
                                   atol=1e-12)
    # an embedding folded from a primal table comes back through the lookup transform
    e = rng.standard_normal((rows, width))
    np.testing.assert_allclose(inverse_embedding_transform(fold_embedding(e, s, block), s,
                                                           block), e, atol=1e-12)


ALL_SIGNED = (forward_transform, inverse_embedding_transform, primal_weight, fold_weight,
              primal_embedding, fold_embedding)


@PROPS
@given(problems())
def test_torch_and_numpy_agree(p) -> None:
    block, width, rows, rng = p
    s = rand_signs(rng, width)
    x = rng.standard_normal((rows, width))
    xt = torch.from_numpy(x.astype(np.float32))
    for fn in ALL_SIGNED:
        for signs in (s, torch.from_numpy(s)):
            got = fn(xt, signs, block)
            assert isinstance(got, torch.Tensor) and got.dtype == torch.float32
            np.testing.assert_allclose(got.numpy(), fn(x, s, block), atol=1e-5)
        got_np = fn(x, torch.from_numpy(s), block)
        assert isinstance(got_np, np.ndarray)
        np.testing.assert_allclose(got_np, fn(x, s, block), atol=1e-12)
    got = block_hadamard(xt, block)
    np.testing.assert_allclose(got.numpy(), x @ dense_block_diag(width, block).T,
                               atol=1e-5)
    # float64 tensors stay float64 and exact to float64 tolerance
    got64 = forward_transform(torch.from_numpy(x), s, block)
    assert got64.dtype == torch.float64
    np.testing.assert_allclose(got64.numpy(), (x * s) @ dense_block_diag(width, block).T,
                               atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_tensors_keep_their_dtype(dtype: torch.dtype) -> None:
    rng = np.random.default_rng(1)
    s = rand_signs(rng, 256)
    x = torch.from_numpy(rng.standard_normal((4, 256))).to(dtype)
    before = x.clone()
    ref = (x.double().numpy() * s) @ dense_block_diag(256, 64).T
    for fn in ALL_SIGNED:
        out = fn(x, s, 64)
        assert out.dtype == dtype
        assert out.shape == x.shape
    out = forward_transform(x, s, 64)
    # fp32 compute then one rounding: within half an ulp of the format
    np.testing.assert_allclose(out.double().numpy(), ref, rtol=1e-2, atol=1e-2)
    assert block_hadamard(x, 64).dtype == dtype
    assert torch.equal(x, before)


def test_numpy_dtypes_and_no_mutation() -> None:
    rng = np.random.default_rng(2)
    s = rand_signs(rng, 16).astype(np.float32)
    x32 = rng.standard_normal((2, 16)).astype(np.float32)
    before = x32.copy()
    assert forward_transform(x32, s, 8).dtype == np.float32
    assert forward_transform(x32.astype(np.float16), s, 8).dtype == np.float16
    assert forward_transform(x32.astype(np.float64), s, 8).dtype == np.float64
    ints = rng.integers(-1, 2, size=(2, 16)).astype(np.int8)
    out = primal_weight(ints, s, 8)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, ints @ dense_block_diag(16, 8) @ np.diag(s),
                               atol=1e-6)
    np.testing.assert_array_equal(x32, before)


def test_leading_dims_zero_rows_and_non_contiguous() -> None:
    rng = np.random.default_rng(3)
    s = rand_signs(rng, 32)
    x = rng.standard_normal((2, 3, 32))
    hbd = dense_block_diag(32, 16)
    np.testing.assert_allclose(forward_transform(x, s, 16), (x * s) @ hbd.T, atol=1e-12)
    assert forward_transform(np.zeros((0, 32)), s, 16).shape == (0, 32)
    assert forward_transform(torch.zeros(0, 32), s, 16).shape == (0, 32)
    xt = rng.standard_normal((32, 5)).T  # non-contiguous view
    np.testing.assert_allclose(forward_transform(xt, s, 16), (xt * s) @ hbd.T, atol=1e-12)
    tt = torch.from_numpy(rng.standard_normal((32, 5))).t()
    np.testing.assert_allclose(forward_transform(tt, s, 16).numpy(),
                               (tt.numpy() * s) @ hbd.T, atol=1e-12)


def test_transform_argument_errors() -> None:
    s = np.ones(24)
    with pytest.raises(ValueError, match="multiple"):
        block_hadamard(np.ones((2, 24)), 16)
    with pytest.raises(ValueError, match="power of two"):
        block_hadamard(np.ones((2, 24)), 12)
    with pytest.raises(ValueError, match="sign vector"):
        forward_transform(np.ones((2, 32)), s, 16)
    with pytest.raises(ValueError, match="sign vector"):
        primal_weight(torch.ones(2, 32), s, 16)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu() -> None:
    rng = np.random.default_rng(4)
    s = rand_signs(rng, 2048)
    x = torch.from_numpy(rng.standard_normal((8, 2048)).astype(np.float32))
    for fn in ALL_SIGNED:
        got = fn(x.cuda().bfloat16(), s, 1024)
        assert got.is_cuda and got.dtype == torch.bfloat16
        torch.testing.assert_close(got.float().cpu(), fn(x.bfloat16(), s, 1024).float())


# ---------------------------------------------------------------------------
# Contract
# ---------------------------------------------------------------------------

WIDTHS = {"blk.0.attn_q.weight": 8, "blk.0.ffn_up.weight": 8, "blk.0.ffn_down.weight": 16,
          "output.weight": 8, "token_embd.weight": 8, "blk.0.attn_norm.weight": 8,
          "blk.0.odd.weight": 10}


def literal_metadata() -> dict[str, object]:
    """A hand-written contract: block 4, widths 8 and 16."""
    return {
        "general.architecture": "qwen35",
        "prism.hadamard.version": 1,
        "prism.hadamard.block_size": 4,
        "prism.hadamard.transform": "normalized-sylvester-walsh-hadamard",
        "prism.hadamard.axis": "input-last-dimension",
        "prism.hadamard.sign_mode": "explicit",
        "prism.hadamard.sign_widths": [8, 16],
        "prism.hadamard.sign_values": [1, -1, 1, 1, -1, -1, 1, -1]
                                      + [-1] * 8 + [1] * 8,
        "prism.hadamard.weight_names": ["blk.0.attn_q.weight", "blk.0.ffn_up.weight",
                                        "blk.0.ffn_down.weight", "output.weight"],
        "prism.hadamard.inverse_weight_names": ["token_embd.weight"],
        "prism.hadamard.gdn_v_grouped": True,
    }


def test_parse_literal_contract() -> None:
    c = parse_hadamard_contract(literal_metadata(), WIDTHS, path="m.gguf")
    assert c is not None
    assert (c.version, c.block_size, c.sign_widths, c.gdn_v_grouped) == (1, 4, (8, 16), True)
    assert c.transform == "normalized-sylvester-walsh-hadamard"
    assert c.axis == "input-last-dimension" and c.sign_mode == "explicit"
    np.testing.assert_array_equal(c.signs_for(8), [1, -1, 1, 1, -1, -1, 1, -1])
    np.testing.assert_array_equal(c.signs_for(16), [-1] * 8 + [1] * 8)
    assert c.signs_for(8).dtype == np.float32
    assert c.is_folded("output.weight") and c.is_folded("blk.0.ffn_down.weight")
    assert not c.is_folded("token_embd.weight") and c.is_inverse_folded("token_embd.weight")
    assert not c.is_folded("blk.0.attn_norm.weight")
    assert not c.is_inverse_folded("output.weight")
    assert c.inverse_weight_names == frozenset({"token_embd.weight"})
    with pytest.raises(GGUFError, match="32") as err:
        c.signs_for(32)
    assert "m.gguf" in str(err.value)


def test_parse_accepts_numpy_values() -> None:
    md = literal_metadata()
    md["prism.hadamard.version"] = np.uint32(1)
    md["prism.hadamard.block_size"] = np.array([4], dtype=np.uint32)
    md["prism.hadamard.transform"] = b"normalized-sylvester-walsh-hadamard"
    md["prism.hadamard.sign_widths"] = np.array([8, 16], dtype=np.uint32)
    md["prism.hadamard.sign_values"] = np.array(md["prism.hadamard.sign_values"], np.int8)
    md["prism.hadamard.weight_names"] = np.array(md["prism.hadamard.weight_names"])
    md["prism.hadamard.gdn_v_grouped"] = np.bool_(False)
    c = parse_hadamard_contract(md, WIDTHS)
    assert c is not None and c.block_size == 4 and c.gdn_v_grouped is False
    assert c.sign_widths == (8, 16) and all(type(w) is int for w in c.sign_widths)
    np.testing.assert_array_equal(c.signs_for(8), [1, -1, 1, 1, -1, -1, 1, -1])
    assert c == parse_hadamard_contract(
        {**literal_metadata(), "prism.hadamard.gdn_v_grouped": False}, WIDTHS)


def test_no_prism_keys_gives_none() -> None:
    assert parse_hadamard_contract({}, WIDTHS) is None
    md = {"general.architecture": "qwen35", "prism.other": 1, "qwen35.block_count": 64}
    assert parse_hadamard_contract(md, WIDTHS) is None


def test_round_trip_through_metadata() -> None:
    c = make_contract([8, 16], 4, ["blk.0.attn_q.weight", "blk.0.ffn_down.weight"],
                      ["token_embd.weight"], seed=7, gdn_v_grouped=False)
    entries = c.to_metadata()
    types = {k: (vt, et) for k, _, vt, et in entries}
    assert types == {
        "prism.hadamard.version": (GGUFValueType.UINT32, None),
        "prism.hadamard.block_size": (GGUFValueType.UINT32, None),
        "prism.hadamard.transform": (GGUFValueType.STRING, None),
        "prism.hadamard.axis": (GGUFValueType.STRING, None),
        "prism.hadamard.sign_mode": (GGUFValueType.STRING, None),
        "prism.hadamard.sign_widths": (GGUFValueType.ARRAY, GGUFValueType.UINT32),
        "prism.hadamard.sign_values": (GGUFValueType.ARRAY, GGUFValueType.INT8),
        "prism.hadamard.weight_names": (GGUFValueType.ARRAY, GGUFValueType.STRING),
        "prism.hadamard.inverse_weight_names": (GGUFValueType.ARRAY, GGUFValueType.STRING),
        "prism.hadamard.gdn_v_grouped": (GGUFValueType.BOOL, None),
    }
    md = {k: v for k, v, _, _ in entries}
    assert md["prism.hadamard.sign_widths"] == [8, 16]
    assert len(md["prism.hadamard.sign_values"]) == 24
    assert set(md["prism.hadamard.sign_values"]) <= {1, -1}
    assert all(type(v) is int for v in md["prism.hadamard.sign_values"])
    assert md["prism.hadamard.gdn_v_grouped"] is False
    back = parse_hadamard_contract(md, WIDTHS)
    assert back == c
    assert hash(back) == hash(c)
    # concatenated in sign_widths order
    np.testing.assert_array_equal(md["prism.hadamard.sign_values"][:8], c.signs_for(8))
    np.testing.assert_array_equal(md["prism.hadamard.sign_values"][8:], c.signs_for(16))


def test_real_file_shaped_contract_round_trips() -> None:
    widths = {"output.weight": 5120, "token_embd.weight": 5120,
              "blk.0.ffn_down.weight": 17408, "blk.0.attn_output.weight": 6144}
    c = make_contract([5120, 6144, 17408], 1024,
                      ["output.weight", "blk.0.ffn_down.weight", "blk.0.attn_output.weight"],
                      ["token_embd.weight"], seed=0)
    md = {k: v for k, v, _, _ in c.to_metadata()}
    assert len(md["prism.hadamard.sign_values"]) == 28672
    assert parse_hadamard_contract(md, widths) == c


def test_make_contract_is_deterministic() -> None:
    a = make_contract([8, 16], 4, ["output.weight"], [], seed=3)
    b = make_contract([8, 16], 4, ["output.weight"], [], seed=3)
    c = make_contract([8, 16], 4, ["output.weight"], [], seed=4)
    assert a == b and a != c
    for w in (8, 16):
        assert a.signs_for(w).shape == (w,) and a.signs_for(w).dtype == np.float32
        assert set(np.unique(a.signs_for(w)).tolist()) <= {-1.0, 1.0}
    big = make_contract([4096], 1024, [], [], seed=0).signs_for(4096)
    assert 0.4 < float((big > 0).mean()) < 0.6  # both signs are used
    with pytest.raises(ValueError):
        make_contract([8, 8], 4, [], [], seed=0)
    with pytest.raises(ValueError):
        make_contract([6], 4, [], [], seed=0)
    with pytest.raises(ValueError):
        make_contract([8], 3, [], [], seed=0)
    with pytest.raises(ValueError):
        make_contract([8], 4, ["x.weight"], ["x.weight"], seed=0)


def test_contract_signs_are_read_only() -> None:
    c = parse_hadamard_contract(literal_metadata(), WIDTHS)
    assert isinstance(c, HadamardContract)
    with pytest.raises(ValueError):
        c.signs_for(8)[0] = 5.0


def _set(key: str, value: object):
    def mutate(md: dict, widths: dict) -> None:
        md[PRISM_KEYS + key] = value
    return mutate


def _drop(key: str):
    def mutate(md: dict, widths: dict) -> None:
        del md[PRISM_KEYS + key]
    return mutate


def _names(key: str, extra: list[str]):
    def mutate(md: dict, widths: dict) -> None:
        md[PRISM_KEYS + key] = list(md[PRISM_KEYS + key]) + extra
    return mutate


def _both(md: dict, widths: dict) -> None:
    md[PRISM_KEYS + "inverse_weight_names"] = ["token_embd.weight", "output.weight"]


def _width(name: str, width: int):
    def mutate(md: dict, widths: dict) -> None:
        widths[name] = width
    return mutate


def _widths_and_values(widths_: list[int], values: list[int]):
    def mutate(md: dict, widths: dict) -> None:
        md[PRISM_KEYS + "sign_widths"] = widths_
        md[PRISM_KEYS + "sign_values"] = values
    return mutate


ERROR_CASES = {
    "version": (_set("version", 2), ["prism.hadamard.version", "2", "1"]),
    "transform": (_set("transform", "hadamard-natural"),
                  ["prism.hadamard.transform", "hadamard-natural",
                   "normalized-sylvester-walsh-hadamard"]),
    "axis": (_set("axis", "output-first-dimension"),
             ["prism.hadamard.axis", "output-first-dimension", "input-last-dimension"]),
    "sign_mode": (_set("sign_mode", "seeded"), ["prism.hadamard.sign_mode", "seeded",
                                                "explicit"]),
    "missing_version": (_drop("version"), ["prism.hadamard.version", "missing"]),
    "missing_sign_values": (_drop("sign_values"), ["prism.hadamard.sign_values", "missing"]),
    "missing_weight_names": (_drop("weight_names"), ["prism.hadamard.weight_names"]),
    "missing_inverse": (_drop("inverse_weight_names"),
                        ["prism.hadamard.inverse_weight_names"]),
    "missing_gdn": (_drop("gdn_v_grouped"), ["prism.hadamard.gdn_v_grouped"]),
    "block_not_pow2": (_set("block_size", 6), ["prism.hadamard.block_size", "6",
                                               "power of two"]),
    "block_zero": (_set("block_size", 0), ["prism.hadamard.block_size"]),
    "block_str": (_set("block_size", "4"), ["prism.hadamard.block_size"]),
    "too_few_values": (_set("sign_values", [1] * 23), ["prism.hadamard.sign_values", "23",
                                                        "24"]),
    "too_many_values": (_set("sign_values", [1] * 25), ["prism.hadamard.sign_values",
                                                         "25", "24"]),
    "bad_sign_value": (_set("sign_values", [1] * 10 + [0] + [1] * 13),
                       ["prism.hadamard.sign_values", "index 10"]),
    "bad_sign_value_two": (_set("sign_values", [-1] * 23 + [2]),
                           ["prism.hadamard.sign_values", "2"]),
    "float_sign_values": (_set("sign_values", [0.5] * 24), ["prism.hadamard.sign_values"]),
    "duplicate_width": (_widths_and_values([8, 8], [1] * 16),
                        ["prism.hadamard.sign_widths", "8", "twice"]),
    "block_not_dividing_width": (_widths_and_values([8, 16, 6], [1] * 30),
                                 ["prism.hadamard.sign_widths", "6"]),
    "unknown_tensor": (_names("weight_names", ["blk.9.attn_q.weight"]),
                       ["prism.hadamard.weight_names", "blk.9.attn_q.weight"]),
    "unknown_inverse_tensor": (_names("inverse_weight_names", ["tok.weight"]),
                               ["prism.hadamard.inverse_weight_names", "tok.weight"]),
    "no_sign_vector": (_width("output.weight", 32),
                       ["prism.hadamard.weight_names", "output.weight", "32"]),
    "no_sign_vector_inverse": (_width("token_embd.weight", 4),
                               ["prism.hadamard.inverse_weight_names",
                                "token_embd.weight", "4"]),
    "block_not_dividing_tensor": (_names("weight_names", ["blk.0.odd.weight"]),
                                  ["blk.0.odd.weight", "10",
                                   "multiple of prism.hadamard.block_size = 4"]),
    "in_both_lists": (_both, ["output.weight", "prism.hadamard.weight_names",
                              "prism.hadamard.inverse_weight_names"]),
    "listed_twice": (_names("weight_names", ["output.weight"]),
                     ["prism.hadamard.weight_names", "output.weight", "twice"]),
    "names_not_strings": (_set("weight_names", [1, 2]), ["prism.hadamard.weight_names"]),
    "gdn_not_bool": (_set("gdn_v_grouped", "yes"), ["prism.hadamard.gdn_v_grouped"]),
    "widths_not_array": (_set("sign_widths", 8), ["prism.hadamard.sign_widths"]),
}


@pytest.mark.parametrize("case", sorted(ERROR_CASES))
def test_contract_errors(case: str) -> None:
    mutate, needles = ERROR_CASES[case]
    md = literal_metadata()
    widths = dict(WIDTHS)
    assert parse_hadamard_contract(md, widths) is not None  # valid before the mutation
    mutate(md, widths)
    with pytest.raises(GGUFError) as err:
        parse_hadamard_contract(md, widths, path="/models/bonsai.gguf")
    message = str(err.value)
    assert message.startswith("/models/bonsai.gguf: ")
    assert err.value.path == "/models/bonsai.gguf"
    for needle in needles:
        assert needle in message, (needle, message)
