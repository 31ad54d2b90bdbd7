"""The config source for Bonsai GGUF files: metadata -> Hugging Face Qwen3.5 text config.

Registered with vLLM as the config format "prism_gguf". The config names our model class
(PrismBonsaiForCausalLM) and carries the "prism" quantization config (block type, group,
Hadamard block and the file to read the sign vectors from).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from vllm_prism.gguf.constants import GGMLType
from vllm_prism.gguf.errors import GGUFError
from vllm_prism.gguf.hadamard import parse_hadamard_contract
from vllm_prism.gguf.inspect import format_kinds, ternary_kinds
from vllm_prism.gguf.qwen35 import qwen35_text_config
from vllm_prism.gguf.reader import GGUFReader

QUANTIZATION = "prism"
CONFIG_FORMAT = "prism_gguf"
LOAD_FORMAT = "prism_gguf"  # the GGUF loader's load format (model_loader/gguf_loader.py)
ARCHITECTURE = "PrismBonsaiForCausalLM"


def is_gguf_model(model: Any) -> bool:
    """Whether a --model value names a GGUF file."""
    return isinstance(model, (str, os.PathLike)) and str(model).lower().endswith(".gguf")


def text_config_of(reader: GGUFReader) -> dict[str, Any]:
    """The Hugging Face Qwen3.5 text config of an open file (vocabulary: the embedding's rows)."""
    vocab = reader.tensors["token_embd.weight"].shape[0] \
        if "token_embd.weight" in reader.tensors else None
    return qwen35_text_config(reader.metadata, reader.path, vocab_size=vocab)


def ternary_type_of(reader: GGUFReader) -> tuple[GGMLType, int]:
    """The one ternary block type (and group) of the file's projections."""
    kinds = ternary_kinds(reader)
    if len(kinds) != 1:
        raise GGUFError(f"vllm-prism serves files whose projections share one ternary type; "
                        f"this one has {format_kinds(kinds)}", reader.path)
    return next(iter(kinds))


def gguf_config_dict(path: str | Path) -> dict[str, Any]:
    """The Hugging Face config (as a dict) of a Bonsai GGUF file."""
    with GGUFReader(path) as reader:
        md = reader.metadata
        config = text_config_of(reader)
        ggml_type, group = ternary_type_of(reader)
        widths = {n: i.ne[0] for n, i in reader.tensors.items()}
        contract = parse_hadamard_contract(md, widths, reader.path)
    # Text-only positions: interleaved MRoPE with three equal position ids is plain NeoX
    # rotary over the rotary dims, which vLLM then runs with 1-D positions.
    rope = dict(config.get("rope_parameters") or {})
    for key in ("mrope_section", "mrope_interleaved"):
        rope.pop(key, None)
    config["rope_parameters"] = rope
    config["architectures"] = [ARCHITECTURE]
    config["quantization_config"] = {
        "quant_method": QUANTIZATION,
        "ggml_type": int(ggml_type),
        "group": int(group),
        "hadamard_block": None if contract is None else contract.block_size,
        "gguf_path": str(Path(path).resolve()),
    }
    return config


def register_config_source() -> None:
    """Register the "prism_gguf" config format with vLLM."""
    from transformers import Qwen3_5TextConfig
    from vllm.transformers_utils.config import HFConfigParser, register_config_parser
    from vllm.transformers_utils.config_parser_base import ConfigParserBase

    @register_config_parser(CONFIG_FORMAT)
    class PrismGGUFConfigParser(ConfigParserBase):
        """Builds the model config from a Bonsai GGUF file's metadata; any other model (a
        speculative drafter in Hugging Face format, which inherits the target's config
        format) is read by vLLM's Hugging Face parser."""

        def parse(self, model: str | Path, trust_remote_code: bool,
                  revision: str | None = None, code_revision: str | None = None,
                  **kwargs: Any) -> tuple[dict, Any]:
            if not is_gguf_model(model):
                return HFConfigParser().parse(model, trust_remote_code, revision,
                                              code_revision, **kwargs)
            config_dict = gguf_config_dict(model)
            return config_dict, Qwen3_5TextConfig(**config_dict)
