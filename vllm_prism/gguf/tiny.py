"""A deterministic tiny model with Bonsai's architecture, written as a GGUF file.

``vllm-prism make-tiny`` uses it; the tests and the README's main command serve it. The
model is a qwen35 (Qwen3.5 text) model: Gated DeltaNet layers and gated full-attention
layers in Bonsai's 3:1 pattern, sized for vLLM's CPU kernels (bf16, linear-attention head
dim 64). Its ternary weights are drawn directly in the folded domain and written as PQ2_0 or
PTQ1_0 with a Hadamard contract (block 128, three sign vectors like the real file's three
widths), or as legacy group-128 Q2_0 without one, laid out as llama.cpp's converter lays out
the first Ternary-Bonsai-27B release: every value-head axis in tiled order, the input
columns of ``ssm_out`` included (its linear-attention heads are 128 wide there, so that a
head spans whole blocks, as in the real model). Small tensors are F32 or BF16, as in the
real file. It carries a byte-level BPE tokenizer trained on a built-in text and a chat
template.

Its logits are decisive: the LM head is built so that, in the folded domain, the row of
token j is the embedding row of the token that precedes j on a fixed cycle through the
vocabulary, so the successor of the current token wins by a wide margin while the layers
(whose outputs are scaled to about a third of the embedding's size) still move every logit.
Greedy decoding then agrees between two correct implementations despite bf16 rounding.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from vllm_prism.gguf.codecs import pack_blocks
from vllm_prism.gguf.constants import GGMLType
from vllm_prism.gguf.hadamard import make_contract
from vllm_prism.gguf.inspect import may_be_ternary
from vllm_prism.gguf.qwen35 import (Qwen35Dims, expected_tensors, gguf_to_hf_name,
                                    hf_to_gguf_tensor, qwen35_metadata,
                                    v_heads_grouped_to_tiled_perm)
from vllm_prism.gguf.tokenizer import tokenizer_metadata, train_tiny_tokenizer
from vllm_prism.gguf.writer import GGUFWriter

FORMATS: dict[str, GGMLType] = {
    "pq2_0": GGMLType.PQ2_0,
    "ptq1_0": GGMLType.PTQ1_0,
    "q2_0": GGMLType.Q2_0,
}
HADAMARD_BLOCK = 128
GROUP = 128
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")

# Training text of the tiny tokenizer (its merges only need to be real, not good).
CORPUS = """\
Bonsai models keep every weight of their linear layers in three values: minus one, zero and
plus one, with one scale for each group of one hundred and twenty eight weights. A rotation
folded into the weights spreads the outliers of each input over many channels, so that the
ternary grid loses little. The model reads its input, thinks about it, and writes an answer
one token at a time. Hello, world! How are you today? I am fine, thank you. What is the
capital of France? Paris is the capital of France. Two plus two is four. The quick brown fox
jumps over the lazy dog. Serving a model well means answering many requests at once, keeping
the memory of each conversation in a cache of keys and values, and reading every weight from
memory as few times as possible. Small models run on small cards; large models need care.
Numbers like 1, 2, 3, 42 and 2026 appear in text too, and so do names, places and dates.
"""


@dataclass(frozen=True)
class TinyConfig:
    """Sizes of the tiny model (all input widths are multiples of 128)."""

    n_layers: int = 4
    hidden: int = 256
    intermediate: int = 512
    n_heads: int = 6
    n_kv_heads: int = 2
    head_dim: int = 64
    n_k_heads: int = 2
    n_v_heads: int = 6
    linear_head_dim: int = 64
    conv_kernel: int = 4
    full_attention_interval: int = 4
    vocab_target: int = 512
    context_length: int = 4096
    rope_theta: float = 1.0e7
    rms_eps: float = 1.0e-6
    rope_dim: int = 16
    rope_sections: tuple[int, ...] = (3, 3, 2, 0)
    layer_gain: float = 0.35  # RMS of a sublayer's output relative to its normalised input
    lm_head_scale: float = 0.1


def _dims(cfg: TinyConfig, vocab_size: int) -> Qwen35Dims:
    return Qwen35Dims(
        n_layers=cfg.n_layers, hidden=cfg.hidden, intermediate=cfg.intermediate,
        n_heads=cfg.n_heads, n_kv_heads=cfg.n_kv_heads, head_dim=cfg.head_dim,
        n_k_heads=cfg.n_k_heads, n_v_heads=cfg.n_v_heads, head_k_dim=cfg.linear_head_dim,
        head_v_dim=cfg.linear_head_dim, conv_kernel=cfg.conv_kernel,
        full_attention_interval=cfg.full_attention_interval, vocab_size=vocab_size)


class _TinyBuilder:
    """Draws the tiny model's tensors in Hugging Face order and value conventions."""

    def __init__(self, cfg: TinyConfig, dims: Qwen35Dims, seed: int) -> None:
        self.cfg = cfg
        self.dims = dims
        self.rng = np.random.default_rng(seed)

    def ternary(self, shape: tuple[int, int], out_rms: float) -> tuple[np.ndarray, np.ndarray]:
        """Random ternary codes and fp16 group scales giving outputs of RMS ``out_rms``
        for inputs of RMS 1."""
        rows, cols = shape
        q = self.rng.integers(-1, 2, size=shape, dtype=np.int8)
        base = out_rms / np.sqrt(cols * 2.0 / 3.0)
        d = base * self.rng.uniform(0.75, 1.25, size=(rows, cols // GROUP))
        return q, d.astype(np.float16)

    def floats(self, shape: tuple[int, ...], mean: float, std: float) -> np.ndarray:
        return (mean + std * self.rng.standard_normal(shape)).astype(np.float32)

    def embedding_and_head(self, n_special: int) -> dict[str, Any]:
        d = self.dims
        z, _ = self.ternary((d.vocab_size, d.hidden), 1.0)
        z_scale = np.full((d.vocab_size, d.hidden // GROUP), np.sqrt(1.5), np.float16)
        normal = np.arange(n_special, d.vocab_size)
        cycle = self.rng.permutation(normal)
        pred = np.empty(d.vocab_size, np.int64)
        pred[cycle] = np.roll(cycle, 1)  # pred[cycle[i]] = cycle[i - 1]
        head_q = np.zeros_like(z)
        head_q[normal] = z[pred[normal]]
        head_d = np.full_like(z_scale, self.cfg.lm_head_scale)
        return {"model.embed_tokens.weight": (z, z_scale), "lm_head.weight": (head_q, head_d)}

    def layer(self, i: int) -> dict[str, Any]:
        d, g = self.dims, self.cfg.layer_gain
        p = f"model.layers.{i}."
        t: dict[str, Any] = {
            p + "input_layernorm.weight": self.floats((d.hidden,), 0.0, 0.1),
            p + "post_attention_layernorm.weight": self.floats((d.hidden,), 0.0, 0.1),
            p + "mlp.gate_proj.weight": self.ternary((d.intermediate, d.hidden), 1.0),
            p + "mlp.up_proj.weight": self.ternary((d.intermediate, d.hidden), 1.0),
            p + "mlp.down_proj.weight": self.ternary((d.hidden, d.intermediate), 2.0 * g),
        }
        if d.is_full_attention(i):
            q_width = d.n_heads * d.head_dim
            kv_width = d.n_kv_heads * d.head_dim
            t.update({
                p + "self_attn.q_proj.weight": self.ternary((2 * q_width, d.hidden), 1.0),
                p + "self_attn.k_proj.weight": self.ternary((kv_width, d.hidden), 1.0),
                p + "self_attn.v_proj.weight": self.ternary((kv_width, d.hidden), 1.0),
                p + "self_attn.o_proj.weight": self.ternary((d.hidden, q_width), 2.0 * g),
                p + "self_attn.q_norm.weight": self.floats((d.head_dim,), 0.0, 0.1),
                p + "self_attn.k_norm.weight": self.floats((d.head_dim,), 0.0, 0.1),
            })
        else:
            t.update({
                p + "linear_attn.in_proj_qkv.weight": self.ternary((d.conv_dim, d.hidden), 1.0),
                p + "linear_attn.in_proj_z.weight": self.ternary((d.value_dim, d.hidden), 1.0),
                p + "linear_attn.in_proj_b.weight": self.floats((d.n_v_heads, d.hidden), 0.0,
                                                                1.0 / np.sqrt(d.hidden)),
                p + "linear_attn.in_proj_a.weight": self.floats((d.n_v_heads, d.hidden), 0.0,
                                                                1.0 / np.sqrt(d.hidden)),
                p + "linear_attn.conv1d.weight": self.floats((d.conv_dim, 1, d.conv_kernel),
                                                             0.0, 0.5),
                p + "linear_attn.dt_bias": self.floats((d.n_v_heads,), 0.0, 0.5),
                p + "linear_attn.A_log": np.log(self.rng.uniform(1.0, 16.0, d.n_v_heads)
                                                ).astype(np.float32),
                p + "linear_attn.norm.weight": self.floats((d.head_v_dim,), 1.0, 0.1),
                p + "linear_attn.out_proj.weight": self.ternary((d.hidden, d.value_dim), 4.0 * g),
            })
        return t


def _tiled_ssm_out(name: str, value: tuple[np.ndarray, np.ndarray],
                   dims: Qwen35Dims) -> tuple[np.ndarray, np.ndarray]:
    """``ssm_out`` (codes, group scales) with its input columns in llama.cpp's tiled order:
    codes move by column, scales by the whole groups a 128-wide value head spans."""
    q, d = value
    if dims.head_v_dim % GROUP:
        raise ValueError(f"legacy q2_0 needs value heads spanning whole {GROUP}-groups, "
                         f"not {dims.head_v_dim} columns")
    q_tiled = hf_to_gguf_tensor(name, q, dims, gdn_v_grouped=False)
    groups = v_heads_grouped_to_tiled_perm(dims.n_k_heads, dims.n_v_heads,
                                           dims.head_v_dim // GROUP)
    return q_tiled, np.ascontiguousarray(d[:, groups])


# Small tensors stored in BF16 (the rest F32), as in the real file.
_BF16_LEAVES = {"ssm_alpha.weight", "ssm_beta.weight"}


def _write_tensor(writer: GGUFWriter, name: str, value: Any, ternary_type: GGMLType) -> None:
    if isinstance(value, tuple):
        q, d = value
        group = GROUP
        raw = pack_blocks(q, d, ternary_type, group=group if ternary_type == GGMLType.Q2_0
                          else None)
        writer.add_tensor(name, raw, ternary_type, shape=q.shape)
        return
    leaf = name.split(".", 2)[-1] if name.startswith("blk.") else name
    ftype = GGMLType.BF16 if leaf in _BF16_LEAVES else GGMLType.F32
    writer.add_tensor(name, np.ascontiguousarray(value, dtype=np.float32), ftype)


# Layer gains: "decisive" (the embedding's successor path dominates) makes greedy tokens agree
# between two correct implementations despite bf16; "small" lets the layers decide the
# argmax, so a wrong transform anywhere changes the tokens (tests/e2e/test_margins.py:
# a forgotten rotation changes 22 of 24 tokens; the smallest top-2 margin is 0.008).
MARGINS = {"decisive": TinyConfig.layer_gain, "small": 1.0}


# The tiny model with 8 attention heads and 8 linear-attention value heads: its row-parallel
# inputs (attn_output, ssm_out, ffn_down) are 512 wide, so tensor-parallel sizes 2 and 4 keep
# every 128-wide Hadamard block on one rank (the default tiny model allows 1 only).
TINY_TP_HEADS = {"n_heads": 8, "n_v_heads": 8}


def make_tiny_gguf(path: str | os.PathLike, *, fmt: str = "pq2_0", seed: int = 0,
                   layers: int = 4, config: TinyConfig | None = None,
                   margins: str = "decisive", tp_friendly: bool = False) -> dict[str, Any]:
    """Write the tiny model to ``path``; returns a summary (vocab size, tensor count, ...).
    ``tp_friendly``: the :data:`TINY_TP_HEADS` variant, for tensor-parallel tests."""
    if margins not in MARGINS:
        raise ValueError(f"--margins must be one of {', '.join(MARGINS)}, got {margins!r}")
    if fmt not in FORMATS:
        raise ValueError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if layers < 1:
        raise ValueError(f"--layers must be at least 1, got {layers}")
    cfg = config or TinyConfig(n_layers=layers, layer_gain=MARGINS[margins],
                               **(TINY_TP_HEADS if tp_friendly else {}))
    ternary_type = FORMATS[fmt]
    legacy = ternary_type == GGMLType.Q2_0
    if legacy and config is None:
        cfg = replace(cfg, linear_head_dim=128)
    tok = train_tiny_tokenizer(CORPUS.splitlines(), cfg.vocab_target, SPECIAL_TOKENS)
    dims = _dims(cfg, tok.get_vocab_size())
    builder = _TinyBuilder(cfg, dims, seed)
    hf: dict[str, Any] = builder.embedding_and_head(len(SPECIAL_TOKENS))
    hf["model.norm.weight"] = builder.floats((dims.hidden,), 0.0, 0.1)
    for i in range(dims.n_layers):
        hf.update(builder.layer(i))

    shapes = expected_tensors(dims)
    gguf: dict[str, Any] = {}
    for name in shapes:
        value = hf[gguf_to_hf_name(name)]
        if legacy and name.endswith(".ssm_out.weight"):
            gguf[name] = _tiled_ssm_out(name, value, dims)
        elif isinstance(value, tuple):
            gguf[name] = tuple(hf_to_gguf_tensor(name, a, dims) for a in value)
        else:
            gguf[name] = hf_to_gguf_tensor(name, value, dims)

    writer = GGUFWriter(path)
    writer.add_metadata("general.name", f"Tiny-Bonsai-{fmt}-s{seed}")
    for key, value, vtype, etype in qwen35_metadata(
            dims, context_length=cfg.context_length, rope_theta=cfg.rope_theta,
            rms_eps=cfg.rms_eps, rope_dim=cfg.rope_dim, rope_sections=cfg.rope_sections):
        writer.add_metadata(key, value, vtype, etype)
    for key, value, vtype, etype in tokenizer_metadata(
            tok, pre="qwen2", special_tokens={"eos": "<|im_end|>", "pad": "<|endoftext|>"},
            chat_template=CHAT_TEMPLATE):
        writer.add_metadata(key, value, vtype, etype)
    if ternary_type != GGMLType.Q2_0:
        folded = [n for n in shapes if may_be_ternary(n) and n != "token_embd.weight"]
        widths = sorted({shapes[n][-1] for n in folded})
        contract = make_contract(widths, HADAMARD_BLOCK, folded, ["token_embd.weight"],
                                 seed=seed + 1)
        for key, value, vtype, etype in contract.to_metadata():
            writer.add_metadata(key, value, vtype, etype)
    for name in shapes:
        _write_tensor(writer, name, gguf[name], ternary_type)
    writer.write()
    return {"path": os.fspath(path), "format": fmt, "vocab_size": dims.vocab_size,
            "n_layers": dims.n_layers, "n_tensors": len(shapes)}


# ----------------------------------------------------------------------- shaped models

# Full-size shapes for benchmarks: real dimensions, random ternary weights.
SHAPES: dict[str, TinyConfig] = {
    "bonsai-2-27b": TinyConfig(
        n_layers=64, hidden=5120, intermediate=17408, n_heads=24, n_kv_heads=4, head_dim=256,
        n_k_heads=16, n_v_heads=48, linear_head_dim=128, conv_kernel=4,
        full_attention_interval=4, vocab_target=248320, context_length=262144,
        rope_theta=1.0e7, rms_eps=1.0e-6, rope_dim=64, rope_sections=(11, 11, 10, 0)),
}
_POOL_BLOCKS = 1 << 20  # random code blocks shared by every tensor (32 MiB of codes)


def _padded_tokenizer(tok: Any, vocab_size: int) -> Any:
    """The tiny tokenizer with placeholder tokens up to ``vocab_size``, so every id the
    model can sample decodes (a real Bonsai file has 248,320 tokens)."""
    import json

    from tokenizers import Tokenizer

    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    used = max([*vocab.values(), *tok.get_added_tokens_decoder()]) + 1
    for i in range(used, vocab_size):
        vocab[f"<|reserved_{i}|>"] = i
    return Tokenizer.from_str(json.dumps(spec))


class _BlockPool:
    """Random ternary 2-bit code blocks drawn once, each with a scale factor in 0.75..1.25 (a
    group's scale varies about its tensor's, as in the tiny model and a real checkpoint); a
    tensor takes a window of them times its own scale, so writing 27 billion weights costs
    copies, not random draws."""

    def __init__(self, rng: np.random.Generator, ternary_type: GGMLType) -> None:
        q = rng.integers(-1, 2, size=(_POOL_BLOCKS, GROUP), dtype=np.int8)
        self.type = ternary_type
        self.raw = pack_blocks(q, np.ones((_POOL_BLOCKS, 1), np.float16), ternary_type)
        self.factor = rng.uniform(0.75, 1.25, size=_POOL_BLOCKS).astype(np.float32)
        self.block_bytes = self.raw.shape[-1]
        self.rng = rng

    def tensor(self, rows: int, cols: int, out_rms: float) -> np.ndarray:
        """uint8 [rows, cols/128 * block_bytes] whose outputs have RMS ``out_rms`` for
        inputs of RMS 1."""
        n = rows * (cols // GROUP)
        start = int(self.rng.integers(0, _POOL_BLOCKS))
        idx = (start + np.arange(n)) % _POOL_BLOCKS
        blocks = self.raw[idx]
        # E[factor^2] = 1 + 0.25^2 / 3: the outputs keep their RMS
        base = out_rms / np.sqrt(cols * 2.0 / 3.0 * (1.0 + 0.25 ** 2 / 3.0))
        d = (self.factor[idx] * np.float32(base)).astype(np.float16).view(np.uint8)
        off = 0 if self.type != GGMLType.PTQ1_0 else self.block_bytes - 2
        blocks[:, off:off + 2] = d.reshape(n, 2)
        return blocks.reshape(rows, -1)


def make_shaped_gguf(path: str | os.PathLike, shape: str, *, fmt: str = "pq2_0",
                     seed: int = 0) -> dict[str, Any]:
    """Write a model of a real Bonsai shape (:data:`SHAPES`) with random ternary weights, a
    Hadamard contract and a tokenizer padded to the full vocabulary: it serves like a real
    file, for benchmarks. Ternary tensors come from a pool of random blocks."""
    if shape not in SHAPES:
        raise ValueError(f"--shape must be one of tiny, {', '.join(SHAPES)}; got {shape!r}")
    if fmt not in ("pq2_0", "ptq1_0"):
        raise ValueError(f"--shape {shape} writes pq2_0 or ptq1_0, not {fmt!r}")
    cfg = SHAPES[shape]
    ternary_type = FORMATS[fmt]
    tok = _padded_tokenizer(train_tiny_tokenizer(CORPUS.splitlines(), 512, SPECIAL_TOKENS),
                            cfg.vocab_target)
    dims = _dims(cfg, cfg.vocab_target)
    builder = _TinyBuilder(cfg, dims, seed)
    pool = _BlockPool(builder.rng, ternary_type)
    shapes = expected_tensors(dims)
    writer = GGUFWriter(path)
    writer.add_metadata("general.name", f"Random-{shape}-{fmt}-s{seed}")
    for entry in qwen35_metadata(dims, context_length=cfg.context_length,
                                 rope_theta=cfg.rope_theta, rms_eps=cfg.rms_eps,
                                 rope_dim=cfg.rope_dim, rope_sections=cfg.rope_sections):
        writer.add_metadata(*entry)
    for entry in tokenizer_metadata(tok, pre="qwen2",
                                    special_tokens={"eos": "<|im_end|>", "pad": "<|endoftext|>"},
                                    chat_template=CHAT_TEMPLATE):
        writer.add_metadata(*entry)
    folded = [n for n in shapes if may_be_ternary(n) and n != "token_embd.weight"]
    contract = make_contract(sorted({shapes[n][-1] for n in folded}), HADAMARD_BLOCK, folded,
                             ["token_embd.weight"], seed=seed + 1)
    for entry in contract.to_metadata():
        writer.add_metadata(*entry)
    gain = cfg.layer_gain
    for name, shp in shapes.items():
        if may_be_ternary(name):
            rows, cols = shp
            rms = 1.0 if name == "token_embd.weight" else (
                2.0 * gain if name.endswith(("ffn_down.weight", "attn_output.weight",
                                             "ssm_out.weight")) else 1.0)
            if name == "output.weight":
                rms = 3.0
            writer.add_tensor(name, pool.tensor(rows, cols, rms), ternary_type, shape=shp)
        else:
            _write_tensor(writer, name, _small_tensor(builder, name, shp, dims), ternary_type)
    writer.write()
    return {"path": os.fspath(path), "format": fmt, "vocab_size": dims.vocab_size,
            "n_layers": dims.n_layers, "n_tensors": len(shapes)}


def _small_tensor(builder: _TinyBuilder, name: str, shape: tuple[int, ...],
                  dims: Qwen35Dims) -> np.ndarray:
    """A float tensor in GGUF conventions, drawn as make-tiny draws it in Hugging Face ones."""
    hf_name = gguf_to_hf_name(name)
    hf_shape = tuple(shape)
    if hf_name.endswith("conv1d.weight"):  # GGUF drops the unit dimension
        hf_shape = (shape[0], 1, shape[1])
    if hf_name.endswith("A_log"):
        value = np.log(builder.rng.uniform(1.0, 16.0, hf_shape)).astype(np.float32)
    elif hf_name.endswith("conv1d.weight"):
        value = builder.floats(hf_shape, 0.0, 0.5)
    elif hf_name.endswith("linear_attn.norm.weight"):
        value = builder.floats(hf_shape, 1.0, 0.1)
    elif hf_name.endswith(("in_proj_a.weight", "in_proj_b.weight")):
        value = builder.floats(hf_shape, 0.0, 1.0 / np.sqrt(dims.hidden))
    else:
        value = builder.floats(hf_shape, 0.0, 0.1 if "norm" in hf_name else 0.5)
    return hf_to_gguf_tensor(name, value, dims)
