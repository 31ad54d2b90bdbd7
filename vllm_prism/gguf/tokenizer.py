"""The tokenizer and chat template stored in a GGUF file's metadata, both ways.

Bonsai files carry a byte-level BPE tokenizer ("gpt2" model in llama.cpp's terms): the
tokens (in byte-level unicode form, as in a Hugging Face vocab.json), the merges, the token
types and the special token ids, plus a Jinja chat template. This module turns that
metadata into a Hugging Face ``tokenizers.Tokenizer`` (for serving) and a tokenizer into
that metadata (for writing tiny test models). It needs the ``tokenizers`` package, which
every vLLM install has; it imports no vLLM.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vllm_prism.gguf.constants import GGUFValueType
from vllm_prism.gguf.errors import GGUFError

if TYPE_CHECKING:
    from tokenizers import Tokenizer

logger = logging.getLogger(__name__)

# llama.cpp token types.
TOKEN_TYPE_NORMAL = 1
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4

# Pre-tokenizer split patterns, by the GGUF "tokenizer.ggml.pre" name.
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
                 r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# Qwen3.5 also keeps combining marks (\p{M}) inside words.
QWEN35_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}|"
                  r" ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
PRE_PATTERNS = {"qwen2": QWEN2_PATTERN, "qwen35": QWEN35_PATTERN}

SPECIAL_ID_KEYS = {
    "bos": "tokenizer.ggml.bos_token_id",
    "eos": "tokenizer.ggml.eos_token_id",
    "pad": "tokenizer.ggml.padding_token_id",
    "unk": "tokenizer.ggml.unknown_token_id",
}


@dataclass
class GGUFTokenizerData:
    """Everything the GGUF metadata says about tokenization."""

    tokens: list[str]
    merges: list[str]
    token_types: list[int]
    pre: str
    special_ids: dict[str, int] = field(default_factory=dict)
    chat_template: str | None = None
    add_bos: bool = False


def _array(metadata: Mapping[str, Any], key: str, element: type, what: str,
           path: str | None) -> list | None:
    """A metadata array whose every element is ``element`` (GGUFError naming the key)."""
    if key not in metadata:
        return None
    value = metadata[key]
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__"):
        raise GGUFError(f"metadata key {key!r} must be an array of {what}, got "
                        f"{type(value).__name__} {value!r:.60}", path)
    items = value.tolist() if hasattr(value, "tolist") else list(value)
    for i, item in enumerate(items):
        ok = isinstance(item, element) and not (element is int and isinstance(item, bool))
        if not ok:
            raise GGUFError(f"metadata key {key!r} must be an array of {what}; element {i} "
                            f"is {type(item).__name__} {item!r:.60}", path)
    return items


def _token_id(metadata: Mapping[str, Any], key: str, n_tokens: int,
              path: str | None) -> int | None:
    if key not in metadata:
        return None
    value = metadata[key]
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, int):
        raise GGUFError(f"metadata key {key!r} must be an integer token id, got "
                        f"{type(value).__name__} {value!r:.60}", path)
    if not 0 <= value < n_tokens:
        raise GGUFError(f"{key} = {value} is outside the vocabulary of {n_tokens}", path)
    return value


def read_tokenizer_data(metadata: Mapping[str, Any], path: str | None = None) -> GGUFTokenizerData:
    """Collect and validate the tokenizer metadata of a GGUF file: every type and every
    reference is checked here, so a bad tokenizer is a GGUFError naming the key."""
    model = metadata.get("tokenizer.ggml.model")
    if model is None or model == "none":
        raise GGUFError("no tokenizer in the file (tokenizer.ggml.model is "
                        f"{'missing' if model is None else 'none'}); pass --tokenizer with a "
                        "Hugging Face tokenizer", path)
    if model != "gpt2":
        raise GGUFError(f"tokenizer.ggml.model is {model!r}; vllm-prism reads byte-level BPE "
                        "('gpt2') tokenizers only; pass --tokenizer instead", path)
    tokens = _array(metadata, "tokenizer.ggml.tokens", str, "strings", path) or []
    if not tokens:
        raise GGUFError("tokenizer.ggml.tokens is missing or empty", path)
    merges = _array(metadata, "tokenizer.ggml.merges", str, "strings", path) or []
    for i, merge in enumerate(merges):
        parts = merge.split(" ")
        if len(parts) != 2 or not all(parts):
            raise GGUFError(f"metadata key 'tokenizer.ggml.merges' must hold pairs \"a b\"; "
                            f"element {i} is {merge!r:.60}", path)
    types = _array(metadata, "tokenizer.ggml.token_type", int, "integers", path)
    if types is None:
        types = [TOKEN_TYPE_NORMAL] * len(tokens)
    if len(types) != len(tokens):
        raise GGUFError(f"tokenizer.ggml.token_type has {len(types)} entries for "
                        f"{len(tokens)} tokens", path)
    special = {}
    for name, key in SPECIAL_ID_KEYS.items():
        tid = _token_id(metadata, key, len(tokens), path)
        if tid is not None:
            special[name] = tid
    pre = metadata.get("tokenizer.ggml.pre", "qwen2")
    template = metadata.get("tokenizer.chat_template")
    for key, value in (("tokenizer.ggml.pre", pre), ("tokenizer.chat_template", template)):
        if value is not None and not isinstance(value, str):
            raise GGUFError(f"metadata key {key!r} must be a string, got "
                            f"{type(value).__name__}", path)
    add_bos = metadata.get("tokenizer.ggml.add_bos_token", False)
    if not isinstance(add_bos, (bool, int)) or hasattr(add_bos, "__len__"):
        raise GGUFError("metadata key 'tokenizer.ggml.add_bos_token' must be a bool", path)
    return GGUFTokenizerData(
        tokens=tokens, merges=merges, token_types=[int(t) for t in types], pre=pre,
        special_ids=special, chat_template=template, add_bos=bool(add_bos))


def chat_template_problem(template: str | None) -> str | None:
    """Why a chat template does not compile (None: it compiles, or there is none), compiled
    as transformers compiles it (a sandboxed Jinja environment)."""
    if template is None:
        return None
    from jinja2 import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    try:
        ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(template)
    except TemplateError as e:
        return f"the chat template does not compile ({type(e).__name__}: {e})"
    return None


def build_tokenizer(data: GGUFTokenizerData, path: str | None = None) -> Tokenizer:
    """A Hugging Face fast tokenizer equivalent to the GGUF byte-level BPE tokenizer; a
    GGUFError (naming ``path``) where the tokenizers library rejects the metadata."""
    try:
        return _build_tokenizer(data)
    except Exception as e:  # noqa: BLE001 - the tokenizers library's own error types
        raise GGUFError("the tokenizer cannot be built from its metadata "
                        f"({type(e).__name__}: {e})", path) from None


def _build_tokenizer(data: GGUFTokenizerData) -> Tokenizer:
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    pattern = PRE_PATTERNS.get(data.pre)
    if pattern is None:
        logger.warning("unknown tokenizer.ggml.pre %r; splitting text like 'qwen2'", data.pre)
        pattern = QWEN2_PATTERN
    vocab = {tok: i for i, tok in enumerate(data.tokens)}
    merges = [tuple(m.split(" ", 1)) for m in data.merges]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False,
                               byte_fallback=False, ignore_merges=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    specials = [AddedToken(t, special=True, normalized=False)
                for t, ty in zip(data.tokens, data.token_types)
                if ty in (TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED)]
    tok.add_special_tokens(specials)
    return tok


def tokenizer_metadata(tokenizer: Tokenizer, *, pre: str, special_tokens: Mapping[str, str],
                       chat_template: str | None) -> list[tuple[str, Any, GGUFValueType,
                                                                GGUFValueType | None]]:
    """Metadata entries (key, value, type, element type) that store ``tokenizer`` in a GGUF."""
    import json

    model = json.loads(tokenizer.to_str())["model"]
    vocab: dict[str, int] = model["vocab"]
    added = {t.content: i for i, t in tokenizer.get_added_tokens_decoder().items()}
    size = max([*vocab.values(), *added.values()]) + 1
    tokens = [""] * size
    types = [TOKEN_TYPE_NORMAL] * size
    for text, i in vocab.items():
        tokens[i] = text
    for text, i in added.items():
        tokens[i] = text
        types[i] = TOKEN_TYPE_CONTROL
    if "" in tokens:
        raise ValueError("tokenizer ids are not contiguous")
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    entries: list[tuple[str, Any, GGUFValueType, GGUFValueType | None]] = [
        ("tokenizer.ggml.model", "gpt2", GGUFValueType.STRING, None),
        ("tokenizer.ggml.pre", pre, GGUFValueType.STRING, None),
        ("tokenizer.ggml.tokens", tokens, GGUFValueType.ARRAY, GGUFValueType.STRING),
        ("tokenizer.ggml.token_type", types, GGUFValueType.ARRAY, GGUFValueType.INT32),
        ("tokenizer.ggml.merges", merges, GGUFValueType.ARRAY, GGUFValueType.STRING),
        ("tokenizer.ggml.add_bos_token", False, GGUFValueType.BOOL, None),
    ]
    for name, text in special_tokens.items():
        if name not in SPECIAL_ID_KEYS:
            raise ValueError(f"unknown special token kind {name!r}")
        entries.append((SPECIAL_ID_KEYS[name], tokens.index(text), GGUFValueType.UINT32, None))
    if chat_template is not None:
        entries.append(("tokenizer.chat_template", chat_template, GGUFValueType.STRING, None))
    return entries


def train_tiny_tokenizer(corpus: Sequence[str], vocab_size: int,
                         special_tokens: Sequence[str]) -> Tokenizer:
    """A small byte-level BPE tokenizer trained on ``corpus`` (deterministic), Qwen2 style."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=list(special_tokens), show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(list(corpus), trainer=trainer)
    return tok
