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


def read_tokenizer_data(metadata: Mapping[str, Any], path: str | None = None) -> GGUFTokenizerData:
    """Collect and validate the tokenizer metadata of a GGUF file."""
    model = metadata.get("tokenizer.ggml.model")
    if model is None:
        raise GGUFError("no tokenizer in the file (tokenizer.ggml.model is missing); "
                        "pass --tokenizer with a Hugging Face tokenizer", path)
    if model != "gpt2":
        raise GGUFError(f"tokenizer.ggml.model is {model!r}; vllm-prism reads byte-level BPE "
                        "('gpt2') tokenizers only; pass --tokenizer instead", path)
    tokens = list(metadata.get("tokenizer.ggml.tokens") or [])
    if not tokens:
        raise GGUFError("tokenizer.ggml.tokens is missing or empty", path)
    merges = list(metadata.get("tokenizer.ggml.merges") or [])
    types = list(metadata.get("tokenizer.ggml.token_type") or [TOKEN_TYPE_NORMAL] * len(tokens))
    if len(types) != len(tokens):
        raise GGUFError(f"tokenizer.ggml.token_type has {len(types)} entries for "
                        f"{len(tokens)} tokens", path)
    special = {}
    for name, key in SPECIAL_ID_KEYS.items():
        if key in metadata:
            tid = int(metadata[key])
            if not 0 <= tid < len(tokens):
                raise GGUFError(f"{key} = {tid} is outside the vocabulary of {len(tokens)}", path)
            special[name] = tid
    pre = str(metadata.get("tokenizer.ggml.pre", "qwen2"))
    return GGUFTokenizerData(
        tokens=tokens, merges=merges, token_types=[int(t) for t in types], pre=pre,
        special_ids=special, chat_template=metadata.get("tokenizer.chat_template"),
        add_bos=bool(metadata.get("tokenizer.ggml.add_bos_token", False)))


def build_tokenizer(data: GGUFTokenizerData) -> Tokenizer:
    """A Hugging Face fast tokenizer equivalent to the GGUF byte-level BPE tokenizer."""
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
