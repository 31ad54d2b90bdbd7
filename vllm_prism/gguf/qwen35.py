"""The qwen35 (Hugging Face Qwen3.5 text) architecture as llama.cpp writes it into GGUF.

Three things live here, all free of vLLM and torch (numpy only):

1. GGUF metadata -> the keyword arguments of transformers' ``Qwen3_5TextConfig``
   (``qwen35_text_config``) and the handful of numbers the tensor conversions need
   (``Qwen35Dims``), with a ``GGUFError`` naming the key for anything missing or inconsistent.
2. The tensor name map GGUF <-> Hugging Face ``Qwen3_5ForCausalLM`` and the shapes a qwen35
   file must hold (``expected_tensors``).
3. Undoing what llama.cpp's converter (``convert_hf_to_gguf.py``: ``Qwen3NextModel`` and
   ``_LinearAttentionVReorderBase``) did to the weights, and its exact inverse for writing test
   models the way llama.cpp would:

   - zero-centred RMSNorm weights are stored as ``1 + w`` (every norm except ``ssm_norm``);
   - ``A_log`` is stored as ``ssm_a = -exp(A_log)``;
   - ``dt_bias`` is stored as ``ssm_dt.bias``;
   - the depthwise ``conv1d`` weight ``[C, 1, K]`` is squeezed to ``[C, K]`` (ggml ne ``[K, C]``);
   - the GatedDeltaNet value heads are reordered from Hugging Face's *grouped* order
     ``[key head, rep, dim]`` to llama.cpp's *tiled* order ``[rep, key head, dim]`` on every
     tensor that produces the value axis (V rows of ``attn_qkv`` and of ``ssm_conv1d``,
     ``attn_gate``, ``ssm_beta``, ``ssm_alpha``, ``ssm_a``, ``ssm_dt``) and on the input columns
     of ``ssm_out``. Prism files set ``prism.hadamard.gdn_v_grouped = true`` and keep
     ``ssm_out`` in grouped order (the caller passes that flag in).

Row permutations work on float arrays and on packed quantized rows (uint8 ``[rows, row_bytes]``)
alike, because a block never spans two rows. Arrays are in numpy order (ggml ``ne`` reversed),
so a matrix is ``[out, in]`` as in Hugging Face.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from vllm_prism.gguf.constants import GGUFValueType
from vllm_prism.gguf.errors import GGUFError

ARCH = "qwen35"
HF_ARCHITECTURE = "Qwen3_5ForCausalLM"
HF_MODEL_TYPE = "qwen3_5_text"

_DEFAULT_RMS_EPS = 1e-6
_DEFAULT_FULL_ATTENTION_INTERVAL = 4  # llama.cpp's default when the key is absent

# --------------------------------------------------------------------------------------------
# Metadata
# --------------------------------------------------------------------------------------------


def _key(name: str) -> str:
    return f"{ARCH}.{name}"


def _is_sequence(value: Any) -> bool:
    return isinstance(value, (list, tuple, np.ndarray))


def _as_int(metadata: Mapping[str, Any], key: str, path: str | None, *,
            required: bool = True, default: int | None = None, minimum: int = 1) -> int | None:
    """An integer metadata value, checked: a GGUFError names the key otherwise."""
    if key not in metadata:
        if required:
            raise GGUFError(f"metadata key {key!r} is missing; a qwen35 file must state it", path)
        return default
    value = metadata[key]
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value.item()
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise GGUFError(
            f"metadata key {key!r} must be an integer, got {type(value).__name__} {value!r}", path)
    value = int(value)
    if value < minimum:
        raise GGUFError(f"metadata key {key!r} must be >= {minimum}, got {value}", path)
    return value


def _as_float(metadata: Mapping[str, Any], key: str, path: str | None, *,
              required: bool = True, default: float | None = None) -> float | None:
    if key not in metadata:
        if required:
            raise GGUFError(f"metadata key {key!r} is missing; a qwen35 file must state it", path)
        return default
    value = metadata[key]
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value.item()
    if isinstance(value, (bool, np.bool_)) \
            or not isinstance(value, (int, float, np.integer, np.floating)):
        raise GGUFError(
            f"metadata key {key!r} must be a number, got {type(value).__name__} {value!r}", path)
    value = float(value)
    if not math.isfinite(value) or value <= 0:
        raise GGUFError(f"metadata key {key!r} must be a positive finite number, got {value}", path)
    return value


def _check_architecture(metadata: Mapping[str, Any], path: str | None) -> None:
    arch = metadata.get("general.architecture")
    if arch is None:
        raise GGUFError("metadata key 'general.architecture' is missing; "
                        "vllm-prism serves qwen35 (Bonsai) files", path)
    if isinstance(arch, bytes):
        arch = arch.decode("utf-8", "replace")
    if arch != ARCH:
        raise GGUFError(f"architecture {arch!r} is not supported; "
                        f"vllm-prism serves {ARCH} (Bonsai) files", path)


@dataclass(frozen=True)
class Qwen35Dims:
    """The numbers the qwen35 tensor shapes and conversions depend on."""

    n_layers: int               # decoder layers (block_count minus any MTP blocks)
    hidden: int                 # embedding_length
    intermediate: int           # feed_forward_length
    n_heads: int                # full attention: query heads
    n_kv_heads: int             # full attention: key/value heads
    head_dim: int               # full attention: key_length == value_length
    n_k_heads: int              # GatedDeltaNet key heads (ssm.group_count)
    n_v_heads: int              # GatedDeltaNet value heads (ssm.time_step_rank)
    head_k_dim: int             # ssm.state_size
    head_v_dim: int             # ssm.inner_size / ssm.time_step_rank (== state_size)
    conv_kernel: int            # ssm.conv_kernel
    full_attention_interval: int  # layers i with (i + 1) % interval == 0 are full attention
    vocab_size: int
    n_mtp_layers: int = 0       # nextn_predict_layers: extra blocks after the decoder stack

    @property
    def key_dim(self) -> int:
        return self.n_k_heads * self.head_k_dim

    @property
    def value_dim(self) -> int:
        return self.n_v_heads * self.head_v_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim

    @property
    def v_per_k(self) -> int:
        return self.n_v_heads // self.n_k_heads

    @property
    def layer_types(self) -> list[str]:
        return ["full_attention" if (i + 1) % self.full_attention_interval == 0
                else "linear_attention" for i in range(self.n_layers)]

    def is_full_attention(self, layer: int) -> bool:
        return (layer + 1) % self.full_attention_interval == 0


def _vocab_size(metadata: Mapping[str, Any], path: str | None, vocab_size: int | None) -> int:
    from_meta = _as_int(metadata, _key("vocab_size"), path, required=False)
    tokens = metadata.get("tokenizer.ggml.tokens")
    from_tokens: int | None = None
    if tokens is not None:
        # A reader may hand the token list itself or (like transformers') just its length.
        if isinstance(tokens, (int, np.integer)) and not isinstance(tokens, bool):
            from_tokens = int(tokens)
        elif hasattr(tokens, "__len__"):
            from_tokens = len(tokens)
    candidates = [("the vocab_size argument (token_embd rows)", vocab_size),
                  (f"metadata key {_key('vocab_size')!r}", from_meta),
                  ("the token count of 'tokenizer.ggml.tokens'", from_tokens)]
    known = [(what, int(v)) for what, v in candidates if v is not None]
    if not known:
        raise GGUFError(f"cannot tell the vocabulary size: neither {_key('vocab_size')!r} nor "
                        "'tokenizer.ggml.tokens' is in the metadata", path)
    what0, size = known[0]
    if size < 1:
        raise GGUFError(f"vocabulary size from {what0} must be positive, got {size}", path)
    # The embedding rows decide; the tokenizer may only be shorter (llama.cpp pads it to the
    # embedding size, but be lenient with a file whose tokenizer lists fewer tokens).
    if vocab_size is not None and from_meta is not None and from_meta != vocab_size:
        raise GGUFError(f"metadata key {_key('vocab_size')!r} = {from_meta} does not match "
                        f"the embedding's {vocab_size} rows", path)
    if vocab_size is None and from_meta is not None and from_tokens is not None \
            and from_tokens > from_meta:
        raise GGUFError(f"'tokenizer.ggml.tokens' has {from_tokens} tokens, more than "
                        f"{_key('vocab_size')!r} = {from_meta}", path)
    if vocab_size is not None and from_tokens is not None and from_tokens > vocab_size:
        raise GGUFError(f"'tokenizer.ggml.tokens' has {from_tokens} tokens, more than the "
                        f"embedding's {vocab_size} rows", path)
    return size


def _full_attention_interval(metadata: Mapping[str, Any], path: str | None,
                             n_layers: int) -> int:
    key = _key("full_attention_interval")
    interval = _as_int(metadata, key, path, required=False,
                       default=_DEFAULT_FULL_ATTENTION_INTERVAL)
    assert interval is not None
    # Newer llama.cpp may state the recurrent layers explicitly; they must agree with the
    # interval pattern, the only schedule this module (and Qwen3.5) knows.
    rkey = _key("attention.recurrent_layers")
    if rkey in metadata:
        recurrent = metadata[rkey]
        if not _is_sequence(recurrent) or len(recurrent) < n_layers:
            raise GGUFError(f"metadata key {rkey!r} must list one flag per layer "
                            f"({n_layers} layers)", path)
        flags = [bool(x) for x in list(recurrent)[:n_layers]]
        if key not in metadata:
            full = [i for i, f in enumerate(flags) if not f]
            interval = full[0] + 1 if full else n_layers + 1
        expected = [(i + 1) % interval != 0 for i in range(n_layers)]
        if flags != expected:
            raise GGUFError(f"metadata key {rkey!r} does not follow a full attention layer every "
                            f"{interval} layers; only that schedule is supported", path)
    return interval


def qwen35_dims(metadata: Mapping[str, Any], path: str | None = None, *,
                vocab_size: int | None = None) -> Qwen35Dims:
    """The dimensions of a qwen35 file, checked for consistency (GGUFError naming the key)."""
    _check_architecture(metadata, path)
    block_count = _as_int(metadata, _key("block_count"), path)
    n_mtp = _as_int(metadata, _key("nextn_predict_layers"), path, required=False, default=0,
                    minimum=0)
    assert block_count is not None and n_mtp is not None
    if n_mtp >= block_count:
        raise GGUFError(f"metadata key {_key('nextn_predict_layers')!r} = {n_mtp} must be "
                        f"smaller than {_key('block_count')!r} = {block_count}", path)
    n_layers = block_count - n_mtp
    hidden = _as_int(metadata, _key("embedding_length"), path)
    intermediate = _as_int(metadata, _key("feed_forward_length"), path)
    n_heads = _as_int(metadata, _key("attention.head_count"), path)
    kv_key = _key("attention.head_count_kv")
    if kv_key in metadata and _is_sequence(metadata[kv_key]):
        raise GGUFError(f"metadata key {kv_key!r} is a per-layer array; qwen35 needs one value",
                        path)
    n_kv_heads = _as_int(metadata, kv_key, path)
    head_dim = _as_int(metadata, _key("attention.key_length"), path)
    value_length = _as_int(metadata, _key("attention.value_length"), path, required=False,
                           default=head_dim)
    assert n_heads is not None and n_kv_heads is not None and head_dim is not None
    if value_length != head_dim:
        raise GGUFError(f"metadata key {_key('attention.value_length')!r} = {value_length} must "
                        f"equal {_key('attention.key_length')!r} = {head_dim} "
                        "(Qwen3.5 has one head_dim)", path)
    if n_heads % n_kv_heads:
        raise GGUFError(f"metadata key {_key('attention.head_count')!r} = {n_heads} is not a "
                        f"multiple of {kv_key!r} = {n_kv_heads}", path)
    conv_kernel = _as_int(metadata, _key("ssm.conv_kernel"), path)
    state_size = _as_int(metadata, _key("ssm.state_size"), path)
    n_k_heads = _as_int(metadata, _key("ssm.group_count"), path)
    n_v_heads = _as_int(metadata, _key("ssm.time_step_rank"), path)
    inner_size = _as_int(metadata, _key("ssm.inner_size"), path)
    assert state_size is not None and n_k_heads is not None and n_v_heads is not None
    if inner_size != n_v_heads * state_size:
        raise GGUFError(
            f"metadata key {_key('ssm.inner_size')!r} = {inner_size} must equal "
            f"{_key('ssm.time_step_rank')!r} * {_key('ssm.state_size')!r} = "
            f"{n_v_heads} * {state_size} = {n_v_heads * state_size} "
            "(Qwen3.5 value heads are as wide as key heads)", path)
    if n_v_heads % n_k_heads:
        raise GGUFError(f"metadata key {_key('ssm.time_step_rank')!r} = {n_v_heads} (value heads) "
                        f"is not a multiple of {_key('ssm.group_count')!r} = {n_k_heads} "
                        "(key heads)", path)
    interval = _full_attention_interval(metadata, path, n_layers)
    return Qwen35Dims(
        n_layers=n_layers, hidden=hidden, intermediate=intermediate,  # type: ignore[arg-type]
        n_heads=n_heads, n_kv_heads=n_kv_heads, head_dim=head_dim,
        n_k_heads=n_k_heads, n_v_heads=n_v_heads, head_k_dim=state_size,
        head_v_dim=state_size, conv_kernel=conv_kernel,  # type: ignore[arg-type]
        full_attention_interval=interval,
        vocab_size=_vocab_size(metadata, path, vocab_size), n_mtp_layers=n_mtp)


def _rope(metadata: Mapping[str, Any], path: str | None, head_dim: int) -> dict[str, Any]:
    theta = _as_float(metadata, _key("rope.freq_base"), path)
    rope_dim = _as_int(metadata, _key("rope.dimension_count"), path)
    assert rope_dim is not None
    if rope_dim > head_dim or rope_dim % 2:
        raise GGUFError(f"metadata key {_key('rope.dimension_count')!r} = {rope_dim} must be "
                        f"even and at most the head dim {head_dim}", path)
    skey = _key("rope.dimension_sections")
    if skey not in metadata:
        raise GGUFError(f"metadata key {skey!r} is missing; a qwen35 file must state its "
                        "interleaved MRoPE sections (llama.cpp requires them too)", path)
    raw = metadata[skey]
    if not _is_sequence(raw) or not all(
            isinstance(s, (int, np.integer)) and not isinstance(s, bool) for s in list(raw)):
        raise GGUFError(f"metadata key {skey!r} must be an array of integers, got {raw!r}", path)
    sections = [int(s) for s in list(raw)]
    # llama.cpp stores four sections (t, h, w, e); Qwen3.5 uses three and leaves e at 0.
    if len(sections) not in (3, 4) or (len(sections) == 4 and sections[3] != 0) \
            or any(s < 0 for s in sections):
        raise GGUFError(f"metadata key {skey!r} = {sections} must be three non-negative sections "
                        "(t, h, w) optionally followed by a 0", path)
    mrope = sections[:3]
    if sum(mrope) != rope_dim // 2:
        raise GGUFError(f"metadata key {skey!r} = {sections} must add up to half of "
                        f"{_key('rope.dimension_count')!r} = {rope_dim}", path)
    return {
        "rope_type": "default",
        "rope_theta": theta,
        "partial_rotary_factor": rope_dim / head_dim,
        "mrope_section": mrope,
        "mrope_interleaved": True,
    }


def qwen35_text_config(metadata: Mapping[str, Any], path: str | None = None, *,
                       vocab_size: int | None = None) -> dict[str, Any]:
    """GGUF metadata -> keyword arguments of transformers' ``Qwen3_5TextConfig``.

    ``vocab_size`` (the embedding's row count, when the caller knows it) wins over the
    metadata; without it the vocabulary is ``qwen35.vocab_size`` or the tokenizer's token count.
    """
    dims = qwen35_dims(metadata, path, vocab_size=vocab_size)
    context = _as_int(metadata, _key("context_length"), path)
    eps = _as_float(metadata, _key("attention.layer_norm_rms_epsilon"), path, required=False,
                    default=_DEFAULT_RMS_EPS)
    rope = _rope(metadata, path, dims.head_dim)
    config: dict[str, Any] = {
        "model_type": HF_MODEL_TYPE,
        "architectures": [HF_ARCHITECTURE],
        "vocab_size": dims.vocab_size,
        "hidden_size": dims.hidden,
        "intermediate_size": dims.intermediate,
        "num_hidden_layers": dims.n_layers,
        "num_attention_heads": dims.n_heads,
        "num_key_value_heads": dims.n_kv_heads,
        "head_dim": dims.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": context,
        "rms_norm_eps": eps,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "attn_output_gate": True,
        "rope_parameters": rope,
        "partial_rotary_factor": rope["partial_rotary_factor"],
        "layer_types": dims.layer_types,
        "linear_conv_kernel_dim": dims.conv_kernel,
        "linear_key_head_dim": dims.head_k_dim,
        "linear_value_head_dim": dims.head_v_dim,
        "linear_num_key_heads": dims.n_k_heads,
        "linear_num_value_heads": dims.n_v_heads,
    }
    for meta_key, field in (("tokenizer.ggml.bos_token_id", "bos_token_id"),
                            ("tokenizer.ggml.eos_token_id", "eos_token_id"),
                            ("tokenizer.ggml.padding_token_id", "pad_token_id")):
        token = _as_int(metadata, meta_key, path, required=False, minimum=0)
        if token is not None:
            if token >= dims.vocab_size:
                raise GGUFError(f"metadata key {meta_key!r} = {token} is outside the "
                                f"vocabulary of {dims.vocab_size} tokens", path)
            config[field] = token
    return config


def qwen35_metadata(dims: Qwen35Dims, *, context_length: int, rope_theta: float, rms_eps: float,
                    rope_dim: int, rope_sections: Sequence[int],
                    ) -> list[tuple[str, Any, GGUFValueType, GGUFValueType | None]]:
    """The architecture metadata llama.cpp's converter writes for a qwen35 model.

    Entries are ``(key, value, type, element type)`` with llama.cpp's types (UINT32
    hyperparameters, FLOAT32 epsilon and rope base, an ARRAY of INT32 for the rope sections).
    llama.cpp writes no ``qwen35.vocab_size``: the vocabulary is the tokenizer's token count.
    """
    u32 = GGUFValueType.UINT32
    f32 = GGUFValueType.FLOAT32
    entries: list[tuple[str, Any, GGUFValueType, GGUFValueType | None]] = [
        ("general.architecture", ARCH, GGUFValueType.STRING, None),
        (_key("block_count"), dims.n_layers + dims.n_mtp_layers, u32, None),
        (_key("context_length"), int(context_length), u32, None),
        (_key("embedding_length"), dims.hidden, u32, None),
        (_key("feed_forward_length"), dims.intermediate, u32, None),
        (_key("attention.head_count"), dims.n_heads, u32, None),
        (_key("attention.head_count_kv"), dims.n_kv_heads, u32, None),
        (_key("attention.key_length"), dims.head_dim, u32, None),
        (_key("attention.value_length"), dims.head_dim, u32, None),
        (_key("attention.layer_norm_rms_epsilon"), float(rms_eps), f32, None),
        (_key("rope.freq_base"), float(rope_theta), f32, None),
        (_key("rope.dimension_count"), int(rope_dim), u32, None),
        (_key("rope.dimension_sections"), [int(s) for s in rope_sections],
         GGUFValueType.ARRAY, GGUFValueType.INT32),
        (_key("full_attention_interval"), dims.full_attention_interval, u32, None),
        (_key("ssm.conv_kernel"), dims.conv_kernel, u32, None),
        (_key("ssm.state_size"), dims.head_k_dim, u32, None),
        (_key("ssm.group_count"), dims.n_k_heads, u32, None),
        (_key("ssm.time_step_rank"), dims.n_v_heads, u32, None),
        (_key("ssm.inner_size"), dims.value_dim, u32, None),
    ]
    if dims.n_mtp_layers:
        entries.append((_key("nextn_predict_layers"), dims.n_mtp_layers, u32, None))
    return entries


# --------------------------------------------------------------------------------------------
# Tensor names
# --------------------------------------------------------------------------------------------

# GGUF leaf (after "blk.N.") -> Hugging Face suffix (after "model.layers.N."). Confirmed against
# llama.cpp's src/llama-arch.cpp tensor names and its qwen35 loader (ssm_dt carries ".bias",
# ssm_a has no suffix), and against transformers' own GGUF qwen35 mapping.
_LAYER_NAMES: dict[str, str] = {
    "attn_norm.weight": "input_layernorm.weight",
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    # full attention
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    # GatedDeltaNet (linear attention)
    "attn_qkv.weight": "linear_attn.in_proj_qkv.weight",
    "attn_gate.weight": "linear_attn.in_proj_z.weight",
    "ssm_beta.weight": "linear_attn.in_proj_b.weight",
    "ssm_alpha.weight": "linear_attn.in_proj_a.weight",
    "ssm_conv1d.weight": "linear_attn.conv1d.weight",
    "ssm_dt.bias": "linear_attn.dt_bias",
    "ssm_a": "linear_attn.A_log",
    "ssm_norm.weight": "linear_attn.norm.weight",
    "ssm_out.weight": "linear_attn.out_proj.weight",
    # MLP
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_LAYER_NAMES_INV = {hf: gg for gg, hf in _LAYER_NAMES.items()}
_GLOBAL_NAMES: dict[str, str] = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output.weight": "lm_head.weight",
    "output_norm.weight": "model.norm.weight",
}
_GLOBAL_NAMES_INV = {hf: gg for gg, hf in _GLOBAL_NAMES.items()}

_GGUF_LAYER_RE = re.compile(r"^blk\.(0|[1-9][0-9]*)\.(.+)$")
_HF_LAYER_RE = re.compile(r"^model\.layers\.(0|[1-9][0-9]*)\.(.+)$")


def gguf_to_hf_name(gguf_name: str) -> str | None:
    """The Hugging Face ``Qwen3_5ForCausalLM`` parameter name, or None for an unknown name.

    The map is by name only: whether layer N is a full-attention or a GatedDeltaNet layer (and
    whether N is past the decoder stack, i.e. an MTP block) is for the caller to check against
    ``expected_tensors``.
    """
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    m = _GGUF_LAYER_RE.match(gguf_name)
    if m is None:
        return None
    hf_leaf = _LAYER_NAMES.get(m.group(2))
    if hf_leaf is None:
        return None
    return f"model.layers.{m.group(1)}.{hf_leaf}"


def hf_to_gguf_name(hf_name: str) -> str:
    """The GGUF tensor name of a Hugging Face ``Qwen3_5ForCausalLM`` parameter (ValueError if
    the parameter has no GGUF counterpart)."""
    if hf_name in _GLOBAL_NAMES_INV:
        return _GLOBAL_NAMES_INV[hf_name]
    m = _HF_LAYER_RE.match(hf_name)
    if m is not None and m.group(2) in _LAYER_NAMES_INV:
        return f"blk.{m.group(1)}.{_LAYER_NAMES_INV[m.group(2)]}"
    raise ValueError(f"{hf_name!r} is not a Qwen3_5ForCausalLM parameter with a GGUF name")


def expected_tensors(dims: Qwen35Dims) -> dict[str, tuple[int, ...]]:
    """Every tensor a qwen35 file must hold: GGUF name -> shape in numpy order (ne reversed)."""
    d = dims
    shapes: dict[str, tuple[int, ...]] = {
        "token_embd.weight": (d.vocab_size, d.hidden),
        "output_norm.weight": (d.hidden,),
        "output.weight": (d.vocab_size, d.hidden),
    }
    for i in range(d.n_layers):
        p = f"blk.{i}."
        shapes[p + "attn_norm.weight"] = (d.hidden,)
        shapes[p + "post_attention_norm.weight"] = (d.hidden,)
        if d.is_full_attention(i):
            q_width = d.n_heads * d.head_dim
            shapes[p + "attn_q.weight"] = (2 * q_width, d.hidden)  # query and gate per head
            shapes[p + "attn_k.weight"] = (d.n_kv_heads * d.head_dim, d.hidden)
            shapes[p + "attn_v.weight"] = (d.n_kv_heads * d.head_dim, d.hidden)
            shapes[p + "attn_output.weight"] = (d.hidden, q_width)
            shapes[p + "attn_q_norm.weight"] = (d.head_dim,)
            shapes[p + "attn_k_norm.weight"] = (d.head_dim,)
        else:
            shapes[p + "attn_qkv.weight"] = (d.conv_dim, d.hidden)
            shapes[p + "attn_gate.weight"] = (d.value_dim, d.hidden)
            shapes[p + "ssm_beta.weight"] = (d.n_v_heads, d.hidden)
            shapes[p + "ssm_alpha.weight"] = (d.n_v_heads, d.hidden)
            shapes[p + "ssm_conv1d.weight"] = (d.conv_dim, d.conv_kernel)
            shapes[p + "ssm_dt.bias"] = (d.n_v_heads,)
            shapes[p + "ssm_a"] = (d.n_v_heads,)
            shapes[p + "ssm_norm.weight"] = (d.head_v_dim,)
            shapes[p + "ssm_out.weight"] = (d.hidden, d.value_dim)
        shapes[p + "ffn_gate.weight"] = (d.intermediate, d.hidden)
        shapes[p + "ffn_up.weight"] = (d.intermediate, d.hidden)
        shapes[p + "ffn_down.weight"] = (d.hidden, d.intermediate)
    return shapes


# --------------------------------------------------------------------------------------------
# Value-head order: grouped (Hugging Face) <-> tiled (llama.cpp)
# --------------------------------------------------------------------------------------------


def v_heads_tiled_to_grouped_perm(n_k_heads: int, n_v_heads: int, head_dim: int) -> np.ndarray:
    """Row permutation p with ``grouped = tiled[p]``.

    Grouped (Hugging Face) rows are ordered [key head, rep, dim]; llama.cpp's tiled rows are
    [rep, key head, dim]. ``head_dim`` is 1 for tensors with one row per value head.
    """
    if n_k_heads < 1 or head_dim < 1 or n_v_heads < 1 or n_v_heads % n_k_heads:
        raise ValueError(f"value heads ({n_v_heads}) must be a positive multiple of key heads "
                         f"({n_k_heads}), head_dim ({head_dim}) positive")
    reps = n_v_heads // n_k_heads
    # tiled[r, k, d] holds flat tiled position (r*K + k)*D + d; read it in grouped order.
    tiled_positions = np.arange(n_v_heads * head_dim, dtype=np.int64).reshape(
        reps, n_k_heads, head_dim)
    return np.ascontiguousarray(tiled_positions.transpose(1, 0, 2)).reshape(-1)


def v_heads_grouped_to_tiled_perm(n_k_heads: int, n_v_heads: int, head_dim: int) -> np.ndarray:
    """Row permutation q with ``tiled = grouped[q]`` (the inverse of the one above)."""
    p = v_heads_tiled_to_grouped_perm(n_k_heads, n_v_heads, head_dim)
    q = np.empty_like(p)
    q[p] = np.arange(p.size, dtype=p.dtype)
    return q


# --------------------------------------------------------------------------------------------
# Tensor conversions
# --------------------------------------------------------------------------------------------

_PLUS_ONE_NORMS = frozenset({"attn_norm.weight", "post_attention_norm.weight",
                             "output_norm.weight", "attn_q_norm.weight", "attn_k_norm.weight"})
_UNCHANGED = frozenset({"token_embd.weight", "output.weight", "ssm_norm.weight",
                        "attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight",
                        "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"})


def _leaf(name: str, path: str | None) -> str:
    """The GGUF leaf ("attn_qkv.weight", "output_norm.weight", ...) of a GGUF or HF name."""
    gguf_name = name
    if gguf_to_hf_name(name) is None:
        try:
            gguf_name = hf_to_gguf_name(name)
        except ValueError:
            raise GGUFError(f"tensor {name!r} is not a qwen35 tensor", path) from None
    m = _GGUF_LAYER_RE.match(gguf_name)
    return m.group(2) if m else gguf_name


def _is_packed(array: np.ndarray) -> bool:
    return array.dtype == np.uint8


def _require_float(name: str, array: np.ndarray, what: str, path: str | None) -> None:
    if not np.issubdtype(array.dtype, np.floating):
        raise GGUFError(f"tensor {name!r}: {what} needs float values, got dtype {array.dtype} "
                        "(a quantized tensor cannot be converted without decoding it)", path)


def _as_compute(array: np.ndarray) -> np.ndarray:
    """Float values in at least float32 (the value transforms are done in float32 or wider)."""
    return array.astype(np.result_type(array.dtype, np.float32), copy=False)


def _check_rows(name: str, array: np.ndarray, rows: int, path: str | None,
                ndim: int | None = None) -> None:
    if array.ndim < 1 or array.shape[0] != rows or (ndim is not None and array.ndim != ndim):
        want = f"{rows} rows" if ndim is None else f"{ndim} dims with {rows} rows"
        raise GGUFError(f"tensor {name!r} has shape {tuple(array.shape)}; expected {want}", path)


def _permute_rows(array: np.ndarray, perm: np.ndarray, offset: int = 0) -> np.ndarray:
    out = np.array(array, copy=True)
    out[offset:] = array[offset:][perm]
    return out


def _permute_columns(name: str, array: np.ndarray, perm_of: Any, value_dim: int,
                     head_v_dim: int, row_block_elems: int | None,
                     path: str | None) -> np.ndarray:
    """Apply a value-axis column permutation (built by ``perm_of(head_dim)``) to ``array``.

    Float arrays move single columns; packed rows ``[rows, row_bytes]`` move whole blocks, which
    is only possible when a value head spans whole blocks.
    """
    if array.ndim != 2:
        raise GGUFError(f"tensor {name!r} has shape {tuple(array.shape)}; expected a matrix",
                        path)
    if not _is_packed(array):
        if array.shape[1] != value_dim:
            raise GGUFError(f"tensor {name!r} has {array.shape[1]} input columns; "
                            f"expected {value_dim}", path)
        return np.ascontiguousarray(array[:, perm_of(head_v_dim)])
    if row_block_elems is None or row_block_elems < 1:
        raise GGUFError(f"tensor {name!r}: reordering the value-head columns of packed rows "
                        "needs row_block_elems (elements per quantization block)", path)
    if value_dim % row_block_elems or head_v_dim % row_block_elems:
        raise GGUFError(f"tensor {name!r}: value heads of {head_v_dim} columns do not span whole "
                        f"blocks of {row_block_elems}; its tiled columns cannot be reordered "
                        "without decoding the blocks", path)
    n_blocks = value_dim // row_block_elems
    row_bytes = array.shape[1]
    if row_bytes % n_blocks:
        raise GGUFError(f"tensor {name!r}: {row_bytes} bytes per row do not hold {n_blocks} "
                        f"blocks of {row_block_elems} elements", path)
    blocks = array.reshape(array.shape[0], n_blocks, row_bytes // n_blocks)
    moved = blocks[:, perm_of(head_v_dim // row_block_elems), :]
    return np.ascontiguousarray(moved).reshape(array.shape[0], row_bytes)


def _convert(name: str, array: np.ndarray, dims: Qwen35Dims, *, to_hf: bool,
             gdn_v_grouped: bool, row_block_elems: int | None,
             path: str | None) -> np.ndarray:
    leaf = _leaf(name, path)
    d = dims
    array = np.asarray(array)

    def perm(head_dim: int) -> np.ndarray:
        if to_hf:
            return v_heads_tiled_to_grouped_perm(d.n_k_heads, d.n_v_heads, head_dim)
        return v_heads_grouped_to_tiled_perm(d.n_k_heads, d.n_v_heads, head_dim)

    def bad_shape(expected: tuple[int, ...]) -> GGUFError:
        return GGUFError(f"tensor {name!r} has shape {tuple(array.shape)}; "
                         f"expected {expected}", path)

    if leaf in _UNCHANGED:
        return array
    if leaf in _PLUS_ONE_NORMS:
        _require_float(name, array, "removing the +1 of a stored norm", path)
        values = _as_compute(array)
        return values - 1 if to_hf else values + 1
    if leaf == "ssm_a":
        _require_float(name, array, "ssm_a <-> A_log", path)
        _check_rows(name, array, d.n_v_heads, path, ndim=1)
        values = _as_compute(array)
        if to_hf:
            if not np.all(values < 0):
                raise GGUFError(f"tensor {name!r} must be negative everywhere "
                                "(llama.cpp stores -exp(A_log))", path)
            return np.log(-values)[perm(1)]
        return (-np.exp(values))[perm(1)]
    if leaf == "ssm_dt.bias":
        _check_rows(name, array, d.n_v_heads, path, ndim=1)
        return array[perm(1)]
    if leaf in ("ssm_beta.weight", "ssm_alpha.weight"):
        _check_rows(name, array, d.n_v_heads, path)
        return array[perm(1)]
    if leaf == "attn_gate.weight":
        _check_rows(name, array, d.value_dim, path)
        return array[perm(d.head_v_dim)]
    if leaf == "attn_qkv.weight":
        # q and k rows stay; only the value rows were tiled.
        _check_rows(name, array, d.conv_dim, path)
        return _permute_rows(array, perm(d.head_v_dim), offset=2 * d.key_dim)
    if leaf == "ssm_conv1d.weight":
        # GGUF [channels, kernel] (ne [kernel, channels]) <-> HF depthwise [channels, 1, kernel].
        if to_hf:
            if array.shape != (d.conv_dim, d.conv_kernel):
                raise bad_shape((d.conv_dim, d.conv_kernel))
            out = _permute_rows(array, perm(d.head_v_dim), offset=2 * d.key_dim)
            return out.reshape(d.conv_dim, 1, d.conv_kernel)
        if array.shape != (d.conv_dim, 1, d.conv_kernel):
            raise bad_shape((d.conv_dim, 1, d.conv_kernel))
        out = array.reshape(d.conv_dim, d.conv_kernel)
        return _permute_rows(out, perm(d.head_v_dim), offset=2 * d.key_dim)
    if leaf == "ssm_out.weight":
        if gdn_v_grouped:
            return array
        # HF column c is tiled column p[c] (to HF); the inverse permutation goes back.
        return _permute_columns(name, array, perm, d.value_dim, d.head_v_dim, row_block_elems,
                                path)
    raise GGUFError(f"tensor {name!r} has no qwen35 conversion", path)  # pragma: no cover


def gguf_to_hf_tensor(name: str, array: np.ndarray, dims: Qwen35Dims, *, gdn_v_grouped: bool,
                      row_block_elems: int | None = None,
                      path: str | None = None) -> np.ndarray:
    """Undo llama.cpp's conversion of one tensor: GGUF values -> Hugging Face values.

    ``name`` is the GGUF (or HF) name; ``array`` is in numpy order, float values or packed
    quantized rows (uint8 ``[rows, row_bytes]``) for the tensors whose conversion is a row
    permutation. ``gdn_v_grouped`` (``prism.hadamard.gdn_v_grouped``) says ``ssm_out`` kept the
    grouped column order; when False its tiled columns are reordered, on packed rows by whole
    blocks of ``row_block_elems`` elements (GGUFError when a value head does not span whole
    blocks). A column reorder of a Hadamard-folded ``ssm_out`` would not commute with the fold;
    this is exact only for weights that were tiled after any fold (or not folded).
    ``path`` only names the file in error messages. Value transforms (norms, ``ssm_a``) return
    float32 (float64 for float64 input); permutations keep the dtype.
    """
    return _convert(name, array, dims, to_hf=True, gdn_v_grouped=gdn_v_grouped,
                    row_block_elems=row_block_elems, path=path)


def hf_to_gguf_tensor(name: str, array: np.ndarray, dims: Qwen35Dims, *,
                      gdn_v_grouped: bool = True, row_block_elems: int | None = None,
                      path: str | None = None) -> np.ndarray:
    """The exact inverse of ``gguf_to_hf_tensor``: Hugging Face values -> what llama.cpp writes."""
    return _convert(name, array, dims, to_hf=False, gdn_v_grouped=gdn_v_grouped,
                    row_block_elems=row_block_elems, path=path)


__all__ = [
    "ARCH",
    "HF_ARCHITECTURE",
    "HF_MODEL_TYPE",
    "Qwen35Dims",
    "expected_tensors",
    "gguf_to_hf_name",
    "gguf_to_hf_tensor",
    "hf_to_gguf_name",
    "hf_to_gguf_tensor",
    "qwen35_dims",
    "qwen35_metadata",
    "qwen35_text_config",
    "v_heads_grouped_to_tiled_perm",
    "v_heads_tiled_to_grouped_perm",
]
