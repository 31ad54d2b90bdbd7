"""make-tiny writes the model it promises, and inspect reports it (and the problems of
broken variants) correctly."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from vllm_prism.gguf.codecs import unpack_blocks
from vllm_prism.gguf.constants import GGMLType
from vllm_prism.gguf.inspect import find_problems, format_report, inspect_gguf
from vllm_prism.gguf.reader import GGUFReader
from vllm_prism.gguf.tiny import make_tiny_gguf
from vllm_prism.gguf.tokenizer import build_tokenizer, read_tokenizer_data
from vllm_prism.gguf.writer import GGUFWriter


@pytest.fixture(scope="module")
def tiny_files(tiny_gguf) -> dict[str, Path]:
    return {fmt: tiny_gguf(fmt) for fmt in ("pq2_0", "ptq1_0", "q2_0")}


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_make_tiny_is_deterministic(tiny_files: dict[str, Path], tmp_path: Path) -> None:
    again = tmp_path / "again.gguf"
    make_tiny_gguf(again, fmt="pq2_0")
    assert _sha(again) == _sha(tiny_files["pq2_0"])
    other = tmp_path / "other.gguf"
    make_tiny_gguf(other, fmt="pq2_0", seed=1)
    assert _sha(other) != _sha(again)


@pytest.mark.parametrize("fmt,ggml_type,label", [
    ("pq2_0", GGMLType.PQ2_0, "PQ2_0"),
    ("ptq1_0", GGMLType.PTQ1_0, "PTQ1_0"),
    ("q2_0", GGMLType.Q2_0, "Q2_0/g128"),
])
def test_tiny_architecture_and_types(tiny_files: dict[str, Path], fmt: str,
                                     ggml_type: GGMLType, label: str) -> None:
    report = inspect_gguf(tiny_files[fmt])
    assert report.problems == []
    assert report.architecture == "qwen35"
    d = report.dims
    assert d is not None
    # legacy q2_0: 128-wide linear-attention heads, so a tiled head spans whole blocks
    head = 128 if fmt == "q2_0" else 64
    assert (d.n_layers, d.hidden, d.head_k_dim, d.head_v_dim) == (4, 256, head, head)
    # Bonsai's 3:1 pattern: only layer 3 of 0..3 is full attention.
    assert d.layer_types == ["linear_attention"] * 3 + ["full_attention"]
    # 27 ternary tensors: embedding, LM head, 3 GDN layers x (qkv, gate, out, 3 MLP) and one
    # attention layer x (q, k, v, o, 3 MLP).
    assert report.types[label].tensors == 2 + 3 * 6 + 7
    assert set(report.types) == {label, "F32", "BF16"}
    with GGUFReader(tiny_files[fmt]) as r:
        assert r.tensors["blk.0.ffn_down.weight"].ggml_type == ggml_type
        assert r.tensors["blk.0.ssm_a"].ggml_type == GGMLType.F32
    text = format_report(report)
    assert "architecture: qwen35" in text and label in text and "problems: none" in text
    if fmt == "q2_0":
        assert report.contract is None
    else:
        assert report.contract is not None
        assert report.contract.block_size == 128
        assert report.contract.sign_widths == (256, 384, 512)
        assert report.contract.inverse_weight_names == {"token_embd.weight"}
        assert "output.weight" in report.contract.weight_names


def test_ptq1_and_pq2_hold_identical_ternary_values(tiny_files: dict[str, Path]) -> None:
    with GGUFReader(tiny_files["pq2_0"]) as a, GGUFReader(tiny_files["ptq1_0"]) as b:
        for name, info in a.tensors.items():
            if info.ggml_type != GGMLType.PQ2_0:
                continue
            qa, da = unpack_blocks(a.raw(name), GGMLType.PQ2_0)
            qb, db = unpack_blocks(b.raw(name), GGMLType.PTQ1_0)
            np.testing.assert_array_equal(qa, qb, err_msg=name)
            np.testing.assert_array_equal(da, db, err_msg=name)
            assert set(np.unique(qa)) <= {-1, 0, 1}


def test_tiny_logits_structure_is_decisive(tiny_files: dict[str, Path]) -> None:
    """In the folded domain the LM head row of token j is the embedding row of its
    predecessor: each normal token has exactly one successor whose head row equals its own
    embedding row, and special tokens have all-zero head rows (never generated)."""
    with GGUFReader(tiny_files["pq2_0"]) as r:
        z, _ = unpack_blocks(r.raw("token_embd.weight"), GGMLType.PQ2_0)
        h, _ = unpack_blocks(r.raw("output.weight"), GGMLType.PQ2_0)
    scores = h.astype(np.int32) @ z.astype(np.int32).T  # [head row j, token t]
    n_special = 3
    assert not h[:n_special].any()
    normal = scores[n_special:, n_special:]
    best = normal.argmax(axis=0)
    assert sorted(best) == list(range(normal.shape[0]))  # a permutation: one successor each
    top2 = np.sort(normal, axis=0)[-2:]
    assert (top2[1] - top2[0]).min() > 60  # margin of the successor in code units


def test_tokenizer_round_trips_through_metadata(tiny_files: dict[str, Path]) -> None:
    with GGUFReader(tiny_files["pq2_0"]) as r:
        data = read_tokenizer_data(r.metadata, r.path)
    tok = build_tokenizer(data)
    text = "Hello, world! The capital of France is Paris. 2026"
    ids = tok.encode(text).ids
    assert tok.decode(ids) == text
    assert len(ids) < len(text.encode())  # merges are used, not just bytes
    chat = "<|im_start|>user\nHi<|im_end|>\n"
    ids = tok.encode(chat).ids
    assert ids[0] == data.tokens.index("<|im_start|>")
    assert data.tokens.index("<|im_end|>") in ids
    assert data.special_ids["eos"] == data.tokens.index("<|im_end|>")
    assert data.chat_template and "add_generation_prompt" in data.chat_template


def _copy_with(src: Path, dst: Path, *, drop: str | None = None, retype: str | None = None,
               extra: str | None = None) -> Path:
    """Rewrite a GGUF, dropping a tensor, storing a float tensor ternary, or adding one."""
    with GGUFReader(src) as r:
        w = GGUFWriter(dst)
        for key, value in r.metadata.items():
            desc = r.metadata_types[key]
            if isinstance(desc, tuple):
                w.add_metadata(key, value, desc[0], desc[1] if not isinstance(desc[1], tuple)
                               else None)
            else:
                w.add_metadata(key, value, desc)
        for name, info in r.tensors.items():
            if name == drop:
                continue
            data = np.array(r.tensor(name))
            if name == retype:
                from vllm_prism.gguf.codecs import pack_blocks, quantize_ternary
                vals = data.astype(np.float32).reshape(1, -1)
                vals = np.pad(vals, ((0, 0), (0, (-vals.shape[1]) % 128)))
                q, d = quantize_ternary(vals, GGMLType.PQ2_0)
                w.add_tensor(name, pack_blocks(q, d, GGMLType.PQ2_0), GGMLType.PQ2_0,
                             shape=vals.shape)
                continue
            w.add_tensor(name, data, info.ggml_type, shape=info.shape)
        if extra:
            w.add_tensor(extra, np.zeros(4, np.float32), GGMLType.F32)
        w.write()
    return dst


@pytest.mark.parametrize("kind,phrase", [
    ("drop", "tensor blk.1.ffn_up.weight is missing"),
    ("retype", "needs it in float"),
    ("extra", "unexpected extra tensor"),
])
def test_inspect_reports_problems(tiny_files: dict[str, Path], tmp_path: Path, kind: str,
                                  phrase: str) -> None:
    kwargs = {"drop": {"drop": "blk.1.ffn_up.weight"},
              "retype": {"retype": "blk.0.ssm_norm.weight"},
              "extra": {"extra": "blk.0.mystery.weight"}}[kind]
    bad = _copy_with(tiny_files["q2_0"], tmp_path / f"{kind}.gguf", **kwargs)
    with GGUFReader(bad) as r:
        _, problems = find_problems(r)
    assert any(phrase in p for p in problems), problems
