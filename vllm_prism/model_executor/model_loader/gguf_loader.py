"""The GGUF loader: stream a Bonsai file's tensors into vLLM's model, zero copy where possible.

Registered as the load format "prism_gguf". Each tensor is read from the memory-mapped file,
renamed to its Hugging Face name, freed of llama.cpp's conversions (row permutations are
applied to packed rows without decoding them) and handed to the model's weight loaders;
ternary tensors stay packed for the prism quantization method.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import numpy as np
import torch
from torch import nn
from vllm.config import ModelConfig
from vllm.logger import init_logger
from vllm.model_executor.model_loader import register_model_loader
from vllm.model_executor.model_loader.base_loader import BaseModelLoader
from tqdm import tqdm

from vllm_prism.gguf.constants import FLOAT_TYPES, GGMLType
from vllm_prism.gguf.floats import float32_from_bf16_bits
from vllm_prism.gguf.hadamard import parse_hadamard_contract
from vllm_prism.gguf.qwen35 import gguf_to_hf_name, gguf_to_hf_tensor, qwen35_dims
from vllm_prism.gguf.reader import GGUFReader
from vllm_prism.transformers_utils.gguf_config import LOAD_FORMAT

logger = init_logger(__name__)



def _float_values(reader: GGUFReader, name: str) -> np.ndarray:
    info = reader.tensors[name]
    data = reader.tensor(name)
    if info.ggml_type == GGMLType.BF16:
        return float32_from_bf16_bits(np.asarray(data))
    return np.asarray(data, dtype=np.float32)


def iterate_gguf_weights(path: str) -> Iterator[tuple[str, torch.Tensor]]:
    """(Hugging Face name, tensor) for every tensor of a Bonsai GGUF file.

    Float tensors come as float32 with llama.cpp's value conversions undone; ternary
    tensors come as their packed uint8 rows (row permutations undone on the bytes).
    """
    with GGUFReader(path) as reader:
        vocab = reader.tensors["token_embd.weight"].shape[0]
        dims = qwen35_dims(reader.metadata, reader.path, vocab_size=vocab)
        widths = {n: i.ne[0] for n, i in reader.tensors.items()}
        contract = parse_hadamard_contract(reader.metadata, widths, reader.path)
        # Without the contract (legacy Q2_0) the file is laid out as llama.cpp's converter
        # lays it out: ssm_out's input columns tiled like every other value-head axis.
        grouped = False if contract is None else contract.gdn_v_grouped
        bar = tqdm(reader.tensors.items(), desc="Loading GGUF tensors", unit="tensor",
                   total=len(reader.tensors), disable=len(reader.tensors) < 64)
        for name, info in bar:
            hf_name = gguf_to_hf_name(name)
            if hf_name is None:  # refused by validation before the engine started
                raise ValueError(f"{reader.path}: tensor {name} has no Hugging Face name")
            if info.ggml_type in FLOAT_TYPES:
                values = _float_values(reader, name)
            else:
                values = reader.raw(name)
            converted = gguf_to_hf_tensor(name, values, dims, gdn_v_grouped=grouped,
                                          row_block_elems=info.layout.block_size)
            yield hf_name, torch.from_numpy(np.ascontiguousarray(converted))


def is_gguf_config(model_config: ModelConfig) -> bool:
    """Whether a model config is a Bonsai GGUF's (made by our config source)."""
    quant = getattr(model_config.hf_config, "quantization_config", None)
    return isinstance(quant, dict) and "gguf_path" in quant


def register_gguf_loader() -> None:
    """Register the "prism_gguf" load format with vLLM."""

    @register_model_loader(LOAD_FORMAT)
    class PrismGGUFModelLoader(BaseModelLoader):
        """Loads a Bonsai GGUF file into PrismBonsaiForCausalLM; any other model (a
        speculative drafter in Hugging Face format, which inherits the target's load format)
        goes to vLLM's default loader."""

        def _other(self) -> BaseModelLoader:
            from vllm.model_executor.model_loader.default_loader import DefaultModelLoader

            return DefaultModelLoader(replace(self.load_config, load_format="auto"))

        def download_model(self, model_config: ModelConfig) -> None:
            if not is_gguf_config(model_config):
                self._other().download_model(model_config)
            # a GGUF is a local file: nothing to download

        def load_weights(self, model: nn.Module, model_config: ModelConfig) -> None:
            if not is_gguf_config(model_config):
                self._other().load_weights(model, model_config)
                return
            path = model_config.hf_config.quantization_config["gguf_path"]
            loaded = model.load_weights(iterate_gguf_weights(path))
            expected = {n for n, _ in model.named_parameters()}
            missing = expected - set(loaded)
            if missing:
                raise ValueError(f"{path}: no weights were loaded for {sorted(missing)[:8]}")
            logger.info("Loaded %d weights from %s", len(loaded), path)
