"""Tests of the qwen35 metadata -> config map, tensor names and llama.cpp conversions.

Expected values are written out by hand here (or computed by an independent re-statement of
llama.cpp's converter / transformers' own code), never by the code under test.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from vllm_prism.gguf.constants import GGUFValueType
from vllm_prism.gguf.errors import GGUFError
from vllm_prism.gguf.qwen35 import (
    ARCH,
    Qwen35Dims,
    expected_tensors,
    gguf_to_hf_name,
    gguf_to_hf_tensor,
    hf_to_gguf_name,
    hf_to_gguf_tensor,
    qwen35_dims,
    qwen35_metadata,
    qwen35_text_config,
    v_heads_grouped_to_tiled_perm,
    v_heads_tiled_to_grouped_perm,
)

# 2 key heads, 4 value heads (2 per key head), head dim 2: the permutation is its own inverse.
SMALL = Qwen35Dims(n_layers=4, hidden=8, intermediate=16, n_heads=2, n_kv_heads=1, head_dim=4,
                   n_k_heads=2, n_v_heads=4, head_k_dim=2, head_v_dim=2, conv_kernel=4,
                   full_attention_interval=4, vocab_size=10)
# 2 key heads, 6 value heads (3 per key head), head dim 2: the permutation is not an involution,
# so these tests also pin the direction.
ASYM = Qwen35Dims(n_layers=4, hidden=8, intermediate=16, n_heads=2, n_kv_heads=1, head_dim=4,
                  n_k_heads=2, n_v_heads=6, head_k_dim=2, head_v_dim=2, conv_kernel=4,
                  full_attention_interval=4, vocab_size=10)

BONSAI_METADATA = {
    "general.architecture": "qwen35",
    "qwen35.block_count": 64,
    "qwen35.context_length": 262144,
    "qwen35.embedding_length": 5120,
    "qwen35.feed_forward_length": 17408,
    "qwen35.attention.head_count": 24,
    "qwen35.attention.head_count_kv": 4,
    "qwen35.attention.key_length": 256,
    "qwen35.attention.value_length": 256,
    "qwen35.attention.layer_norm_rms_epsilon": 1e-6,
    "qwen35.rope.freq_base": 1e7,
    "qwen35.rope.dimension_count": 64,
    "qwen35.rope.dimension_sections": [11, 11, 10, 0],
    "qwen35.full_attention_interval": 4,
    "qwen35.ssm.conv_kernel": 4,
    "qwen35.ssm.state_size": 128,
    "qwen35.ssm.group_count": 16,
    "qwen35.ssm.time_step_rank": 48,
    "qwen35.ssm.inner_size": 6144,
    "tokenizer.ggml.eos_token_id": 248046,
    "tokenizer.ggml.padding_token_id": 248044,
}
BONSAI_VOCAB = 248320


def bonsai_metadata(**changes):
    meta = dict(BONSAI_METADATA)
    meta["tokenizer.ggml.tokens"] = ["tok"] * BONSAI_VOCAB
    for key, value in changes.items():
        if value is None:
            meta.pop(key, None)
        else:
            meta[key] = value
    return meta


# ------------------------------------------------------------------ value-head permutations


def test_hand_built_permutation_two_reps():
    # Rows labelled (key head, rep, dim). Hugging Face (grouped): key head outermost.
    grouped = [(0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1),
               (1, 0, 0), (1, 0, 1), (1, 1, 0), (1, 1, 1)]
    # llama.cpp (tiled): rep outermost, then key head.
    tiled = [(0, 0, 0), (0, 0, 1), (1, 0, 0), (1, 0, 1),
             (0, 1, 0), (0, 1, 1), (1, 1, 0), (1, 1, 1)]
    p = v_heads_tiled_to_grouped_perm(2, 4, 2)
    assert p.tolist() == [0, 1, 4, 5, 2, 3, 6, 7]
    assert [tiled[i] for i in p] == grouped
    q = v_heads_grouped_to_tiled_perm(2, 4, 2)
    assert [grouped[i] for i in q] == tiled

    # Float rows: the value of a row encodes its label 100k + 10r + d.
    tiled_rows = np.array([[100 * k + 10 * r + d, -1.0] for k, r, d in tiled])
    got = tiled_rows[p]
    assert got[:, 0].tolist() == [0, 1, 10, 11, 100, 101, 110, 111]

    # Packed rows: uint8 [rows, row_bytes]; every byte of a row moves with it.
    packed = np.array([[k * 16 + r * 4 + d, 200 + i, 7] for i, (k, r, d) in enumerate(tiled)],
                      dtype=np.uint8)
    moved = packed[p]
    assert moved.tolist() == [[0, 200, 7], [1, 201, 7], [4, 204, 7], [5, 205, 7],
                              [16, 202, 7], [17, 203, 7], [20, 206, 7], [21, 207, 7]]


def test_hand_built_permutation_three_reps_pins_direction():
    # 2 key heads, 3 reps, one row per head. Grouped head h = 3k + r.
    # Tiled order (r outer, k inner): h0, h3, h1, h4, h2, h5.
    p = v_heads_tiled_to_grouped_perm(2, 6, 1)
    q = v_heads_grouped_to_tiled_perm(2, 6, 1)
    assert p.tolist() == [0, 2, 4, 1, 3, 5]
    assert q.tolist() == [0, 3, 1, 4, 2, 5]
    tiled_heads = np.array(["h0", "h3", "h1", "h4", "h2", "h5"])
    assert tiled_heads[p].tolist() == ["h0", "h1", "h2", "h3", "h4", "h5"]


def _llama_cpp_reorder_v_heads(x: np.ndarray, axis: int, n_k: int, reps: int, hd: int):
    """llama.cpp's _LinearAttentionVReorderBase._reorder_v_heads, restated in numpy:
    reshape the axis to [n_k, reps, hd] and swap the first two (grouped -> tiled)."""
    shape = list(x.shape)
    new_shape = shape[:axis] + [n_k, reps, hd] + shape[axis + 1:]
    y = x.reshape(new_shape).swapaxes(axis, axis + 1)
    return np.ascontiguousarray(y).reshape(shape)


@pytest.mark.parametrize("n_k,n_v,hd", [(16, 48, 128), (2, 6, 3), (4, 4, 5), (3, 12, 1)])
def test_permutation_undoes_llama_cpp_reorder(n_k, n_v, hd):
    grouped = np.arange(n_v * hd)
    tiled = _llama_cpp_reorder_v_heads(grouped, 0, n_k, n_v // n_k, hd)
    p = v_heads_tiled_to_grouped_perm(n_k, n_v, hd)
    q = v_heads_grouped_to_tiled_perm(n_k, n_v, hd)
    assert np.array_equal(tiled[p], grouped)
    assert np.array_equal(grouped[q], tiled)


def test_permutation_matches_transformers_gguf_loader():
    mapping = pytest.importorskip("transformers.integrations.gguf.gguf_conversion_mapping")
    for n_k, n_v, hd in [(16, 48, 128), (2, 6, 3)]:
        theirs = mapping.TiledToGroupedRows(n_k, n_v // n_k, hd).permutation.numpy()
        assert np.array_equal(v_heads_tiled_to_grouped_perm(n_k, n_v, hd), theirs)


def test_permutation_rejects_bad_head_counts():
    with pytest.raises(ValueError):
        v_heads_tiled_to_grouped_perm(4, 6, 2)


# ------------------------------------------------------------------ single conversions


@pytest.mark.parametrize("name", [
    "output_norm.weight", "blk.0.attn_norm.weight", "blk.2.post_attention_norm.weight",
    "blk.3.attn_q_norm.weight", "blk.3.attn_k_norm.weight"])
def test_norms_stored_plus_one(name):
    stored = np.array([1.5, 0.75, 1.0, 2.0], dtype=np.float32)
    assert gguf_to_hf_tensor(name, stored, SMALL, gdn_v_grouped=True).tolist() == \
        [0.5, -0.25, 0.0, 1.0]
    assert hf_to_gguf_tensor(name, np.array([0.5, -0.25, 0.0, 1.0]), SMALL).tolist() == \
        [1.5, 0.75, 1.0, 2.0]


def test_ssm_norm_is_raw():
    stored = np.array([1.5, 0.75], dtype=np.float32)
    assert gguf_to_hf_tensor("blk.0.ssm_norm.weight", stored, SMALL,
                             gdn_v_grouped=True).tolist() == [1.5, 0.75]


def test_ssm_a_is_minus_exp_and_tiled():
    # HF A_log[h] = log(h + 1) for grouped heads h0..h5; llama.cpp stores -exp(A_log) = -(h+1)
    # in tiled head order h0 h3 h1 h4 h2 h5.
    stored = np.array([-1.0, -4.0, -2.0, -5.0, -3.0, -6.0], dtype=np.float32)
    got = gguf_to_hf_tensor("blk.0.ssm_a", stored, ASYM, gdn_v_grouped=True)
    np.testing.assert_allclose(got, np.log([1.0, 2.0, 3.0, 4.0, 5.0, 6.0]), rtol=1e-6)
    back = hf_to_gguf_tensor("model.layers.0.linear_attn.A_log",
                             np.log(np.arange(1.0, 7.0)), ASYM)
    np.testing.assert_allclose(back, stored, rtol=1e-12)


def test_ssm_a_must_be_negative():
    with pytest.raises(GGUFError, match="blk.0.ssm_a.*negative"):
        gguf_to_hf_tensor("blk.0.ssm_a", np.array([-1.0, 0.5, -1, -1, -1, -1]), ASYM,
                          gdn_v_grouped=True)


def test_ssm_dt_untiled():
    stored = np.array([10, 13, 11, 14, 12, 15], dtype=np.float32)
    got = gguf_to_hf_tensor("blk.1.ssm_dt.bias", stored, ASYM, gdn_v_grouped=True)
    assert got.tolist() == [10, 11, 12, 13, 14, 15]


@pytest.mark.parametrize("name", ["blk.0.ssm_beta.weight", "blk.0.ssm_alpha.weight"])
def test_beta_alpha_rows_untiled(name):
    stored = np.array([[h, -h] for h in (0, 3, 1, 4, 2, 5)], dtype=np.float32)
    got = gguf_to_hf_tensor(name, stored, ASYM, gdn_v_grouped=True)
    assert got[:, 0].tolist() == [0, 1, 2, 3, 4, 5]
    assert got[:, 1].tolist() == [0, -1, -2, -3, -4, -5]


def test_conv1d_squeezed_and_v_channels_untiled():
    # ASYM: q 4 channels, k 4 channels, v 12 channels (6 heads x 2). ne [4, 20] -> numpy [20, 4].
    tiled_v = [10 * h + d for h in (0, 3, 1, 4, 2, 5) for d in (0, 1)]
    channels = [0, 1, 2, 3, 4, 5, 6, 7] + [100 + c for c in tiled_v]
    stored = np.array([[c, c + 0.25, c + 0.5, c + 0.75] for c in channels], dtype=np.float32)
    got = gguf_to_hf_tensor("blk.0.ssm_conv1d.weight", stored, ASYM, gdn_v_grouped=True)
    assert got.shape == (20, 1, 4)
    expected_channels = [0, 1, 2, 3, 4, 5, 6, 7,
                         100, 101, 110, 111, 120, 121, 130, 131, 140, 141, 150, 151]
    assert got[:, 0, 0].tolist() == expected_channels
    assert got[:, 0, 3].tolist() == [c + 0.75 for c in expected_channels]


def test_attn_qkv_untiles_only_v_rows_float_and_packed():
    tiled_v = [10 * h + d for h in (0, 3, 1, 4, 2, 5) for d in (0, 1)]
    rows = [0, 1, 2, 3, 4, 5, 6, 7] + [100 + c for c in tiled_v]
    expected = [0, 1, 2, 3, 4, 5, 6, 7,
                100, 101, 110, 111, 120, 121, 130, 131, 140, 141, 150, 151]
    floats = np.array([[r] * 8 for r in rows], dtype=np.float32)
    got = gguf_to_hf_tensor("blk.0.attn_qkv.weight", floats, ASYM, gdn_v_grouped=True)
    assert got[:, 0].tolist() == expected and got[:, 7].tolist() == expected
    # Packed rows: 2 blocks of 3 bytes each per row (uint8 [rows, row_bytes]).
    packed = np.array([[r, r, 9, 1, 2, r] for r in rows], dtype=np.uint8)
    got = gguf_to_hf_tensor("blk.0.attn_qkv.weight", packed, ASYM, gdn_v_grouped=True)
    assert got.dtype == np.uint8 and got.shape == (20, 6)
    assert got.tolist() == [[r, r, 9, 1, 2, r] for r in expected]


def test_attn_gate_rows_untiled_packed():
    tiled = [10 * h + d for h in (0, 3, 1, 4, 2, 5) for d in (0, 1)]
    packed = np.array([[t, 255 - t] for t in tiled], dtype=np.uint8)
    got = gguf_to_hf_tensor("blk.0.attn_gate.weight", packed, ASYM, gdn_v_grouped=True)
    grouped = [0, 1, 10, 11, 20, 21, 30, 31, 40, 41, 50, 51]
    assert got.tolist() == [[g, 255 - g] for g in grouped]


def test_ssm_out_grouped_is_untouched():
    arr = np.arange(8 * 12, dtype=np.float32).reshape(8, 12)
    assert np.array_equal(gguf_to_hf_tensor("blk.0.ssm_out.weight", arr, ASYM,
                                            gdn_v_grouped=True), arr)


def test_ssm_out_tiled_columns_float():
    tiled_cols = [10 * h + d for h in (0, 3, 1, 4, 2, 5) for d in (0, 1)]
    arr = np.array([tiled_cols, [-c for c in tiled_cols]], dtype=np.float32)
    got = gguf_to_hf_tensor("blk.0.ssm_out.weight", arr, ASYM, gdn_v_grouped=False)
    grouped = [0, 1, 10, 11, 20, 21, 30, 31, 40, 41, 50, 51]
    assert got.tolist() == [grouped, [-g for g in grouped]]


def test_ssm_out_tiled_columns_packed_whole_blocks():
    # One block of 2 elements per value head (head_v_dim 2), 2 bytes per block, 6 heads.
    # Block bytes of head h: [10h, 10h + 1]. Stored in tiled head order h0 h3 h1 h4 h2 h5.
    row = [b for h in (0, 3, 1, 4, 2, 5) for b in (10 * h, 10 * h + 1)]
    packed = np.array([row, [255 - b for b in row]], dtype=np.uint8)
    got = gguf_to_hf_tensor("blk.0.ssm_out.weight", packed, ASYM, gdn_v_grouped=False,
                            row_block_elems=2)
    grouped = [0, 1, 10, 11, 20, 21, 30, 31, 40, 41, 50, 51]
    assert got.tolist() == [grouped, [255 - g for g in grouped]]
    # One element per block (12 blocks of 1 byte): single bytes move with their head.
    got1 = gguf_to_hf_tensor("blk.0.ssm_out.weight", packed, ASYM, gdn_v_grouped=False,
                             row_block_elems=1)
    assert got1.tolist() == [grouped, [255 - g for g in grouped]]


def test_ssm_out_packed_refuses_blocks_across_heads():
    packed = np.zeros((2, 6), dtype=np.uint8)
    with pytest.raises(GGUFError, match="whole"):
        gguf_to_hf_tensor("blk.0.ssm_out.weight", packed, ASYM, gdn_v_grouped=False,
                          row_block_elems=4)
    with pytest.raises(GGUFError, match="row_block_elems"):
        gguf_to_hf_tensor("blk.0.ssm_out.weight", packed, ASYM, gdn_v_grouped=False)


def test_value_transforms_refuse_packed():
    with pytest.raises(GGUFError, match="attn_norm"):
        gguf_to_hf_tensor("blk.0.attn_norm.weight", np.zeros(8, np.uint8), SMALL,
                          gdn_v_grouped=True)


def test_wrong_row_count_is_refused():
    with pytest.raises(GGUFError, match="^m.gguf: tensor 'blk.0.attn_gate.weight' has shape"):
        gguf_to_hf_tensor("blk.0.attn_gate.weight", np.zeros((7, 8), np.float32), ASYM,
                          gdn_v_grouped=True, path="m.gguf")
    with pytest.raises(GGUFError, match="ssm_conv1d"):
        gguf_to_hf_tensor("blk.0.ssm_conv1d.weight", np.zeros((20, 1, 4), np.float32), ASYM,
                          gdn_v_grouped=True)


def test_passthrough_tensors():
    arr = np.arange(80, dtype=np.float32).reshape(10, 8)
    for name in ("token_embd.weight", "output.weight"):
        assert np.array_equal(gguf_to_hf_tensor(name, arr, SMALL, gdn_v_grouped=True), arr)


# ------------------------------------------------------------------ inverses, llama.cpp reference


def _hf_shape(gguf_name: str, gguf_shape: tuple[int, ...]) -> tuple[int, ...]:
    if gguf_name.endswith("ssm_conv1d.weight"):
        return (gguf_shape[0], 1, gguf_shape[1])
    return gguf_shape


def _llama_cpp_convert(hf_name: str, t: np.ndarray, d: Qwen35Dims, v_grouped_out: bool):
    """llama.cpp's converter for one Qwen3.5 tensor (Qwen3NextModel.modify_tensors and
    _LinearAttentionVReorderBase.modify_tensors), restated in numpy from its source."""
    reps, hk, hv = d.n_v_heads // d.n_k_heads, d.head_k_dim, d.head_v_dim
    if hf_name.endswith(".A_log"):
        t = -np.exp(t)
    elif "conv1d" in hf_name:
        t = t.squeeze()
    elif hf_name.endswith("norm.weight") and not hf_name.endswith("linear_attn.norm.weight"):
        t = t + 1
    if "linear_attn." in hf_name and reps > 1:
        if ".in_proj_qkv." in hf_name or ".conv1d" in hf_name:
            qk = hk * d.n_k_heads * 2
            t = np.concatenate([t[:qk], _llama_cpp_reorder_v_heads(t[qk:], 0, d.n_k_heads,
                                                                   reps, hv)])
        elif ".in_proj_z." in hf_name:
            t = _llama_cpp_reorder_v_heads(t, 0, d.n_k_heads, reps, hv)
        elif ".in_proj_b." in hf_name or ".in_proj_a." in hf_name:
            t = _llama_cpp_reorder_v_heads(t, 0, d.n_k_heads, reps, 1)
        elif ".A_log" in hf_name or ".dt_bias" in hf_name:
            t = _llama_cpp_reorder_v_heads(t[:, None], 0, d.n_k_heads, reps, 1)[:, 0]
        elif ".out_proj." in hf_name and not v_grouped_out:
            t = _llama_cpp_reorder_v_heads(t, 1, d.n_k_heads, reps, hv)
    return t


@pytest.mark.parametrize("dims", [SMALL, ASYM], ids=["small", "asym"])
@pytest.mark.parametrize("grouped", [True, False], ids=["grouped", "tiled"])
def test_hf_to_gguf_matches_llama_cpp_and_inverts(dims, grouped):
    rng = np.random.default_rng(0)
    shapes = expected_tensors(dims)
    for gguf_name, shape in shapes.items():
        hf_name = gguf_to_hf_name(gguf_name)
        hf = rng.standard_normal(_hf_shape(gguf_name, shape))
        written = hf_to_gguf_tensor(hf_name, hf, dims, gdn_v_grouped=grouped)
        assert written.shape == shape, gguf_name
        np.testing.assert_allclose(written, _llama_cpp_convert(hf_name, hf, dims, grouped),
                                   rtol=1e-12, err_msg=gguf_name)
        # GGUF names are accepted too, and the two directions are inverses.
        assert np.array_equal(hf_to_gguf_tensor(gguf_name, hf, dims, gdn_v_grouped=grouped),
                              written)
        back = gguf_to_hf_tensor(gguf_name, written, dims, gdn_v_grouped=grouped)
        assert back.shape == hf.shape, gguf_name
        np.testing.assert_allclose(back, hf, rtol=1e-9, atol=1e-12, err_msg=gguf_name)
        again = hf_to_gguf_tensor(gguf_name, back, dims, gdn_v_grouped=grouped)
        np.testing.assert_allclose(again, written, rtol=1e-9, atol=1e-12, err_msg=gguf_name)


@pytest.mark.parametrize("leaf,rows", [("attn_qkv.weight", 20), ("attn_gate.weight", 12),
                                       ("ssm_beta.weight", 6), ("ssm_alpha.weight", 6)])
def test_packed_row_permutations_invert(leaf, rows):
    rng = np.random.default_rng(1)
    packed = rng.integers(0, 256, size=(rows, 34), dtype=np.uint8)
    name = f"blk.1.{leaf}"
    hf = gguf_to_hf_tensor(name, packed, ASYM, gdn_v_grouped=True)
    assert hf.dtype == np.uint8 and not np.array_equal(hf, packed)
    assert np.array_equal(hf_to_gguf_tensor(name, hf, ASYM), packed)


def test_packed_ssm_out_columns_invert():
    rng = np.random.default_rng(2)
    packed = rng.integers(0, 256, size=(8, 6 * 5), dtype=np.uint8)  # 6 blocks of 5 bytes
    hf = gguf_to_hf_tensor("blk.0.ssm_out.weight", packed, ASYM, gdn_v_grouped=False,
                           row_block_elems=2)
    back = hf_to_gguf_tensor("blk.0.ssm_out.weight", hf, ASYM, gdn_v_grouped=False,
                             row_block_elems=2)
    assert np.array_equal(back, packed) and not np.array_equal(hf, packed)


# ------------------------------------------------------------------ names


NAME_PAIRS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output.weight": "lm_head.weight",
    "output_norm.weight": "model.norm.weight",
    "blk.3.attn_q.weight": "model.layers.3.self_attn.q_proj.weight",
    "blk.3.attn_output.weight": "model.layers.3.self_attn.o_proj.weight",
    "blk.7.attn_k_norm.weight": "model.layers.7.self_attn.k_norm.weight",
    "blk.10.post_attention_norm.weight": "model.layers.10.post_attention_layernorm.weight",
    "blk.0.attn_qkv.weight": "model.layers.0.linear_attn.in_proj_qkv.weight",
    "blk.0.attn_gate.weight": "model.layers.0.linear_attn.in_proj_z.weight",
    "blk.0.ssm_beta.weight": "model.layers.0.linear_attn.in_proj_b.weight",
    "blk.0.ssm_alpha.weight": "model.layers.0.linear_attn.in_proj_a.weight",
    "blk.2.ssm_conv1d.weight": "model.layers.2.linear_attn.conv1d.weight",
    "blk.0.ssm_dt.bias": "model.layers.0.linear_attn.dt_bias",
    "blk.0.ssm_a": "model.layers.0.linear_attn.A_log",
    "blk.0.ssm_norm.weight": "model.layers.0.linear_attn.norm.weight",
    "blk.0.ssm_out.weight": "model.layers.0.linear_attn.out_proj.weight",
    "blk.5.ffn_down.weight": "model.layers.5.mlp.down_proj.weight",
}


@pytest.mark.parametrize("gguf_name,hf_name", list(NAME_PAIRS.items()))
def test_name_map_literals(gguf_name, hf_name):
    assert gguf_to_hf_name(gguf_name) == hf_name
    assert hf_to_gguf_name(hf_name) == gguf_name


@pytest.mark.parametrize("name", [
    "blk.0.ssm_dt.weight", "blk.0.ssm_a.weight", "blk.0.ssm_dt", "rope_freqs.weight",
    "blk.x.attn_norm.weight", "blk.01.attn_norm.weight", "blk.64.nextn.eh_proj.weight",
    "blk.0.ffn_gate_exps.weight", "token_embd", "model.embed_tokens.weight", ""])
def test_unknown_gguf_names(name):
    assert gguf_to_hf_name(name) is None


def test_unknown_hf_name_raises():
    with pytest.raises(ValueError):
        hf_to_gguf_name("model.layers.0.linear_attn.in_proj_qkvz.weight")
    with pytest.raises(ValueError):
        hf_to_gguf_name("mtp.fc.weight")


def test_expected_tensors_four_layers_both_directions():
    shapes = expected_tensors(SMALL)
    # 3 globals + 3 GDN layers x 14 + 1 full-attention layer x 11.
    assert len(shapes) == 3 + 3 * 14 + 11
    assert shapes["blk.3.attn_q.weight"] == (16, 8)          # 2 heads x 4 x (query, gate)
    assert shapes["blk.3.attn_output.weight"] == (8, 8)
    assert shapes["blk.0.attn_qkv.weight"] == (16, 8)        # q 4 + k 4 + v 8
    assert shapes["blk.0.ssm_conv1d.weight"] == (16, 4)
    assert shapes["blk.0.ssm_out.weight"] == (8, 8)
    assert shapes["blk.2.ssm_a"] == (4,)
    assert "blk.3.attn_qkv.weight" not in shapes and "blk.0.attn_q.weight" not in shapes
    hf_names = set()
    for name in shapes:
        hf = gguf_to_hf_name(name)
        assert hf is not None, name
        assert hf_to_gguf_name(hf) == name
        hf_names.add(hf)
    assert len(hf_names) == len(shapes)


def test_bonsai_tensor_shapes():
    dims = qwen35_dims(bonsai_metadata())
    shapes = expected_tensors(dims)
    assert len(shapes) == 3 + 48 * 14 + 16 * 11
    assert shapes["blk.0.attn_qkv.weight"] == (10240, 5120)
    assert shapes["blk.0.ssm_conv1d.weight"] == (10240, 4)
    assert shapes["blk.0.ssm_out.weight"] == (5120, 6144)
    assert shapes["blk.3.attn_q.weight"] == (12288, 5120)
    assert shapes["blk.3.attn_k.weight"] == (1024, 5120)
    assert shapes["blk.63.attn_output.weight"] == (5120, 6144)
    assert shapes["blk.62.ffn_down.weight"] == (5120, 17408)
    assert shapes["token_embd.weight"] == (248320, 5120)
    # The spec's ternary census: 402 matrices; 851 tensors in all.
    matrices = [n for n, s in shapes.items() if len(s) == 2 and "conv1d" not in n
                and "ssm_beta" not in n and "ssm_alpha" not in n]
    assert len(matrices) == 402
    assert len(shapes) == 851


# ------------------------------------------------------------------ config


def test_bonsai_config_builds_transformers_config():
    transformers = pytest.importorskip("transformers")
    cfg = qwen35_text_config(bonsai_metadata(), "bonsai.gguf")
    config = transformers.Qwen3_5TextConfig(**cfg)
    assert config.model_type == "qwen3_5_text"
    assert config.architectures == ["Qwen3_5ForCausalLM"]
    assert config.num_hidden_layers == 64
    assert config.hidden_size == 5120
    assert config.intermediate_size == 17408
    assert config.num_attention_heads == 24
    assert config.num_key_value_heads == 4
    assert config.head_dim == 256
    assert config.vocab_size == 248320
    assert config.max_position_embeddings == 262144
    assert config.rms_norm_eps == 1e-6
    assert config.tie_word_embeddings is False
    assert config.hidden_act == "silu"
    assert config.attn_output_gate is True
    full = [i for i, t in enumerate(config.layer_types) if t == "full_attention"]
    assert full == [3, 7, 11, 15, 19, 23, 27, 31, 35, 39, 43, 47, 51, 55, 59, 63]
    assert all(t == "linear_attention" for i, t in enumerate(config.layer_types) if i not in full)
    assert len(config.layer_types) == 64
    rope = config.rope_parameters
    assert rope["rope_theta"] == 1e7
    assert rope["partial_rotary_factor"] == 0.25
    assert rope["mrope_section"] == [11, 11, 10]
    assert rope["mrope_interleaved"] is True
    assert config.linear_conv_kernel_dim == 4
    assert config.linear_key_head_dim == 128
    assert config.linear_value_head_dim == 128
    assert config.linear_num_key_heads == 16
    assert config.linear_num_value_heads == 48
    assert config.eos_token_id == 248046
    assert config.pad_token_id == 248044
    assert config.bos_token_id is None


def _tiny_metadata() -> dict:
    dims = Qwen35Dims(n_layers=4, hidden=256, intermediate=512, n_heads=4, n_kv_heads=2,
                      head_dim=64, n_k_heads=2, n_v_heads=4, head_k_dim=32, head_v_dim=32,
                      conv_kernel=4, full_attention_interval=4, vocab_size=1000)
    entries = qwen35_metadata(dims, context_length=4096, rope_theta=1e7, rms_eps=1e-6,
                              rope_dim=16, rope_sections=[3, 3, 2, 0])
    meta = {key: value for key, value, _, _ in entries}
    meta["tokenizer.ggml.tokens"] = [f"t{i}" for i in range(1000)]
    return meta


def test_qwen35_metadata_types_follow_llama_cpp():
    dims = qwen35_dims(bonsai_metadata())
    entries = qwen35_metadata(dims, context_length=262144, rope_theta=1e7, rms_eps=1e-6,
                              rope_dim=64, rope_sections=[11, 11, 10, 0])
    by_key = {key: (value, vtype, etype) for key, value, vtype, etype in entries}
    assert by_key["general.architecture"] == ("qwen35", GGUFValueType.STRING, None)
    assert by_key["qwen35.block_count"] == (64, GGUFValueType.UINT32, None)
    assert by_key["qwen35.ssm.inner_size"] == (6144, GGUFValueType.UINT32, None)
    assert by_key["qwen35.ssm.time_step_rank"] == (48, GGUFValueType.UINT32, None)
    assert by_key["qwen35.attention.layer_norm_rms_epsilon"] == \
        (1e-6, GGUFValueType.FLOAT32, None)
    assert by_key["qwen35.rope.freq_base"] == (1e7, GGUFValueType.FLOAT32, None)
    assert by_key["qwen35.rope.dimension_sections"] == \
        ([11, 11, 10, 0], GGUFValueType.ARRAY, GGUFValueType.INT32)
    assert "qwen35.vocab_size" not in by_key  # llama.cpp's converter does not write it
    # Everything the metadata reader needs comes back unchanged.
    meta = {key: value for key, value, _, _ in entries}
    meta["tokenizer.ggml.tokens"] = ["tok"] * BONSAI_VOCAB
    assert qwen35_dims(meta) == dims
    assert qwen35_text_config(meta) == qwen35_text_config(bonsai_metadata(
        **{"tokenizer.ggml.eos_token_id": None, "tokenizer.ggml.padding_token_id": None}))


def test_tiny_model_state_dict_names_match_the_name_map():
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    meta = _tiny_metadata()
    cfg = qwen35_text_config(meta)
    config = transformers.Qwen3_5TextConfig(**cfg)
    torch.manual_seed(0)
    model = transformers.Qwen3_5ForCausalLM(config)
    state = model.state_dict()
    dims = qwen35_dims(meta)
    shapes = expected_tensors(dims)
    ours = {gguf_to_hf_name(name): name for name in shapes}
    assert set(state) == set(ours)
    for hf_name, tensor in state.items():
        gguf_name = ours[hf_name]
        zeros = np.zeros(shapes[gguf_name], dtype=np.float32)
        if gguf_name.endswith("ssm_a"):
            zeros -= 1.0
        converted = gguf_to_hf_tensor(gguf_name, zeros, dims, gdn_v_grouped=True)
        assert tuple(tensor.shape) == converted.shape, hf_name
        # Writing the model's own weights the llama.cpp way and reading them back is lossless.
        value = tensor.detach().float().numpy()
        written = hf_to_gguf_tensor(hf_name, value, dims)
        assert written.shape == shapes[gguf_name], hf_name
        np.testing.assert_allclose(gguf_to_hf_tensor(gguf_name, written, dims,
                                                     gdn_v_grouped=True),
                                   value, rtol=1e-5, atol=1e-6, err_msg=hf_name)


def test_vocab_size_sources():
    meta = bonsai_metadata()
    assert qwen35_text_config(meta)["vocab_size"] == 248320
    assert qwen35_text_config(meta, vocab_size=248320)["vocab_size"] == 248320
    no_tokens = bonsai_metadata(**{"tokenizer.ggml.tokens": None})
    assert qwen35_text_config(no_tokens, vocab_size=1234 + 248320)["vocab_size"] == 249554
    assert qwen35_text_config(bonsai_metadata(**{"tokenizer.ggml.tokens": None,
                                                 "qwen35.vocab_size": 248320}))["vocab_size"] \
        == 248320
    with pytest.raises(GGUFError, match="vocab"):
        qwen35_text_config(no_tokens)
    with pytest.raises(GGUFError, match="qwen35.vocab_size"):
        qwen35_text_config(bonsai_metadata(**{"qwen35.vocab_size": 1000}), vocab_size=248320)


def test_eps_defaults_when_absent():
    meta = bonsai_metadata(**{"qwen35.attention.layer_norm_rms_epsilon": None})
    assert qwen35_text_config(meta)["rms_norm_eps"] == 1e-6
    meta = bonsai_metadata(**{"qwen35.attention.layer_norm_rms_epsilon": 1e-5})
    assert qwen35_text_config(meta)["rms_norm_eps"] == 1e-5


def test_numpy_metadata_values_are_accepted():
    meta = bonsai_metadata()
    meta["qwen35.block_count"] = np.uint32(64)
    meta["qwen35.rope.freq_base"] = np.float32(1e7)
    meta["qwen35.rope.dimension_sections"] = np.array([11, 11, 10, 0], dtype=np.int32)
    cfg = qwen35_text_config(meta)
    assert cfg["num_hidden_layers"] == 64 and type(cfg["num_hidden_layers"]) is int
    assert cfg["rope_parameters"]["mrope_section"] == [11, 11, 10]


def test_mtp_blocks_are_not_decoder_layers():
    meta = bonsai_metadata(**{"qwen35.block_count": 65, "qwen35.nextn_predict_layers": 1})
    dims = qwen35_dims(meta)
    assert dims.n_layers == 64 and dims.n_mtp_layers == 1
    assert "blk.64.attn_norm.weight" not in expected_tensors(dims)


def test_recurrent_layers_key_must_agree():
    flags = [(i + 1) % 4 != 0 for i in range(64)]
    assert qwen35_dims(bonsai_metadata(**{"qwen35.attention.recurrent_layers": flags})) \
        .full_attention_interval == 4
    bad = list(flags)
    bad[0] = False
    with pytest.raises(GGUFError, match="recurrent_layers"):
        qwen35_dims(bonsai_metadata(**{"qwen35.attention.recurrent_layers": bad}))


# ------------------------------------------------------------------ errors


@pytest.mark.parametrize("key", [
    "qwen35.block_count", "qwen35.embedding_length", "qwen35.feed_forward_length",
    "qwen35.attention.head_count", "qwen35.attention.head_count_kv",
    "qwen35.attention.key_length", "qwen35.ssm.conv_kernel", "qwen35.ssm.state_size",
    "qwen35.ssm.group_count", "qwen35.ssm.time_step_rank", "qwen35.ssm.inner_size",
    "qwen35.context_length", "qwen35.rope.freq_base", "qwen35.rope.dimension_count",
    "qwen35.rope.dimension_sections", "general.architecture"])
def test_missing_key_is_named(key):
    with pytest.raises(GGUFError) as info:
        qwen35_text_config(bonsai_metadata(**{key: None}), "/models/bonsai.gguf")
    assert key in str(info.value)
    assert "/models/bonsai.gguf" in str(info.value)


def test_wrong_architecture():
    with pytest.raises(GGUFError) as info:
        qwen35_text_config(bonsai_metadata(**{"general.architecture": "llama"}), "m.gguf")
    assert str(info.value) == ("m.gguf: architecture 'llama' is not supported; "
                               "vllm-prism serves qwen35 (Bonsai) files")
    assert ARCH == "qwen35"


def test_inconsistent_inner_size():
    with pytest.raises(GGUFError) as info:
        qwen35_dims(bonsai_metadata(**{"qwen35.ssm.inner_size": 6000}))
    message = str(info.value)
    assert "qwen35.ssm.inner_size" in message and "6144" in message


@pytest.mark.parametrize("changes,fragment", [
    ({"qwen35.ssm.time_step_rank": 40, "qwen35.ssm.inner_size": 40 * 128},
     "qwen35.ssm.group_count"),
    ({"qwen35.attention.value_length": 128}, "qwen35.attention.value_length"),
    ({"qwen35.attention.head_count_kv": 5}, "qwen35.attention.head_count"),
    ({"qwen35.rope.dimension_sections": [11, 11, 11, 0]}, "qwen35.rope.dimension_sections"),
    ({"qwen35.rope.dimension_sections": [11, 11, 10, 2]}, "qwen35.rope.dimension_sections"),
    ({"qwen35.rope.dimension_count": 65}, "qwen35.rope.dimension_count"),
    ({"qwen35.block_count": "64"}, "qwen35.block_count"),
    ({"qwen35.block_count": 0}, "qwen35.block_count"),
    ({"qwen35.rope.freq_base": -1.0}, "qwen35.rope.freq_base"),
    ({"qwen35.attention.head_count_kv": [4] * 64}, "qwen35.attention.head_count_kv"),
    ({"tokenizer.ggml.eos_token_id": 248320}, "tokenizer.ggml.eos_token_id"),
])
def test_inconsistent_metadata(changes, fragment):
    with pytest.raises(GGUFError) as info:
        qwen35_text_config(bonsai_metadata(**changes))
    assert fragment in str(info.value)


def test_math_sanity_of_bonsai_rope():
    cfg = qwen35_text_config(bonsai_metadata())
    assert math.isclose(cfg["rope_parameters"]["partial_rotary_factor"] * 256, 64)
