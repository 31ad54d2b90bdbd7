"""The "prism" quantization method: ternary Bonsai weights kept packed, y = W_st·H(s⊙x).

Every ternary projection of a Bonsai GGUF (PQ2_0, PTQ1_0 or legacy Q2_0 blocks) stays in its
packed bytes, one uint8 row per output feature. When the file carries PrismML's Hadamard
contract, the weights are folded: a linear layer computes W_st · Hblk(s ⊙ x) and the
embedding applies s ⊙ Hblk(z) after the row lookup. The LM head is a folded linear too.

On CPU both methods run the exact torch computation (decode codes and scales, the block
Hadamard, a float32 matmul); the GPU kernels are tested against this path.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch
from torch.nn import Parameter
from vllm.distributed import get_tensor_model_parallel_rank
from vllm.logger import init_logger
from vllm.model_executor.layers.linear import LinearBase, LinearMethodBase, \
    UnquantizedLinearMethod
from vllm.model_executor.layers.quantization import register_quantization_config
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig, \
    QuantizeMethodBase
from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding
from vllm.model_executor.utils import set_weight_attrs

from vllm_prism.gguf.codecs import block_layout
from vllm_prism.gguf.codecs_torch import dequantize_to
from vllm_prism.gguf.constants import GGMLType
from vllm_prism.transformers_utils.gguf_config import QUANTIZATION
from vllm_prism.kernels.pq2.hadamard import (inverse_signed_hadamard_torch,
                                             signed_hadamard_torch)

logger = init_logger(__name__)

PRISM_QUANT = QUANTIZATION
# Projections of the Gated DeltaNet that Bonsai keeps in float.
FLOAT_LINEAR_SUFFIXES = (".conv1d", ".in_proj_ba")


@functools.cache
def _load_signs(gguf_path: str) -> dict[int, np.ndarray]:
    """The Hadamard sign vectors of a GGUF file, by input width (read once per process)."""
    from vllm_prism.gguf.hadamard import parse_hadamard_contract
    from vllm_prism.gguf.reader import GGUFReader

    with GGUFReader(gguf_path) as reader:
        widths = {n: i.ne[0] for n, i in reader.tensors.items()}
        contract = parse_hadamard_contract(reader.metadata, widths, reader.path)
    if contract is None:
        return {}
    return {w: np.array(s, dtype=np.float32) for w, s in contract.signs.items()}


@register_quantization_config(PRISM_QUANT)
class PrismConfig(QuantizationConfig):
    """Ternary weights of one GGUF block type, optionally Hadamard-folded."""

    def __init__(self, ggml_type: int, group: int, hadamard_block: int | None,
                 gguf_path: str | None) -> None:
        super().__init__()
        self.ggml_type = GGMLType(ggml_type)
        self.group = group
        self.hadamard_block = hadamard_block
        self.gguf_path = gguf_path
        self.layout = block_layout(self.ggml_type, group if self.ggml_type == GGMLType.Q2_0
                                   else None)

    def __repr__(self) -> str:
        return (f"PrismConfig(type={self.ggml_type.name}, group={self.group}, "
                f"hadamard_block={self.hadamard_block})")

    def get_name(self) -> str:
        return PRISM_QUANT

    def get_supported_act_dtypes(self) -> list[torch.dtype]:
        return [torch.bfloat16, torch.float16, torch.float32]

    @classmethod
    def get_min_capability(cls) -> int:
        return 80

    @staticmethod
    def get_config_filenames() -> list[str]:
        return []

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> PrismConfig:
        return cls(ggml_type=int(config.get("ggml_type", GGMLType.PQ2_0)),
                   group=int(config.get("group", 128)),
                   hadamard_block=config.get("hadamard_block"),
                   gguf_path=config.get("gguf_path"))

    def signs_for(self, width: int) -> np.ndarray | None:
        """The sign vector of input width ``width`` (None: the weights are not folded)."""
        if self.hadamard_block is None:
            return None
        if self.gguf_path is None:
            raise ValueError("the prism quantization config names no GGUF file to read the "
                             "Hadamard signs from")
        signs = _load_signs(self.gguf_path).get(width)
        if signs is None:
            raise ValueError(f"{self.gguf_path}: the Hadamard contract has no sign vector for "
                             f"input width {width}")
        return signs

    def get_quant_method(self, layer: torch.nn.Module, prefix: str) -> QuantizeMethodBase | None:
        if isinstance(layer, VocabParallelEmbedding):
            return PrismEmbeddingMethod(self)
        if isinstance(layer, LinearBase):
            if prefix.endswith(FLOAT_LINEAR_SUFFIXES):
                return PrismFloatLinearMethod()
            return PrismLinearMethod(self)
        return None


def _dense_linear_gemm(layer: torch.nn.Module, x: torch.Tensor, weight: torch.Tensor,
                       bias: torch.Tensor | None = None) -> torch.Tensor:
    return torch.ops.vllm_prism.dense_linear(x, weight, bias)


class PrismFloatLinearMethod(UnquantizedLinearMethod):
    """vLLM's unquantized linear for the float projections Bonsai keeps (``in_proj_ba``); on
    CUDA, where vLLM would call ``F.linear``, the op ``vllm_prism::dense_linear`` runs it
    instead (``F.linear`` too, unless ``VLLM_PRISM_DENSE_GEMV`` picks the small-M GEMV; read
    inside the op). Every other platform and linear backend keeps vLLM's own GEMM."""

    def __init__(self) -> None:
        super().__init__()
        from vllm.model_executor.layers.utils import default_unquantized_gemm
        from vllm.platforms import current_platform

        if current_platform.is_cuda() and self._gemm_impl is default_unquantized_gemm:
            from vllm_prism._custom_ops import register_ops

            register_ops()
            self._gemm_impl = _dense_linear_gemm

    def apply_halves(self, layer: torch.nn.Module, x: torch.Tensor,
                     clear_width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(y [2, M, N/2], zeros [M, clear_width])`` for x [M, K]: the two halves of the
        projection's output rows, each contiguous, and a zeroed buffer (the Gated DeltaNet
        core's ``b``, ``a`` and output). On CUDA one op (``vllm_prism::dense_linear_halves``:
        the small-M GEMV writes both and clears the buffer in one launch where it runs);
        elsewhere vLLM's GEMM, then the copy and the fill vLLM's layer does."""
        if self._gemm_impl is _dense_linear_gemm:
            return torch.ops.vllm_prism.dense_linear_halves(x, layer.weight, layer.bias,
                                                            clear_width)
        from vllm_prism._custom_ops import halves_and_zeros

        return halves_and_zeros(self.apply(layer, x, layer.bias), clear_width)


def _partition_signs(config: PrismConfig, layer: torch.nn.Module, input_size: int,
                     input_size_per_partition: int) -> torch.Tensor | None:
    signs = config.signs_for(input_size)
    if signs is None:
        return None
    if input_size_per_partition != input_size:
        start = get_tensor_model_parallel_rank() * input_size_per_partition
        signs = signs[start:start + input_size_per_partition]
    if input_size_per_partition % config.hadamard_block:
        raise ValueError(f"{type(layer).__name__}: the input width per rank "
                         f"({input_size_per_partition}) is not a multiple of the Hadamard "
                         f"block ({config.hadamard_block}); use a smaller tensor-parallel size")
    return torch.from_numpy(np.ascontiguousarray(signs))


class PrismLinearMethod(LinearMethodBase):
    """A folded (or plain) ternary linear layer over packed GGUF rows."""

    def __init__(self, config: PrismConfig) -> None:
        self.config = config

    def create_weights(self, layer: torch.nn.Module, input_size_per_partition: int,
                       output_partition_sizes: list[int], input_size: int, output_size: int,
                       params_dtype: torch.dtype, **extra_weight_attrs: Any) -> None:
        layout = self.config.layout
        if input_size_per_partition % layout.block_size:
            raise ValueError(f"{type(layer).__name__}: input width per rank "
                             f"{input_size_per_partition} is not a multiple of the "
                             f"{self.config.ggml_type.name} block ({layout.block_size})")
        row_bytes = input_size_per_partition // layout.block_size * layout.type_size
        weight = Parameter(torch.empty(sum(output_partition_sizes), row_bytes,
                                       dtype=torch.uint8), requires_grad=False)
        set_weight_attrs(weight, {"input_dim": 1, "output_dim": 0})
        set_weight_attrs(weight, extra_weight_attrs)
        layer.register_parameter("weight", weight)
        signs = _partition_signs(self.config, layer, input_size, input_size_per_partition)
        layer.register_buffer("prism_signs", signs, persistent=False)
        layer.prism_out_dtype = params_dtype

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        if layer.prism_signs is not None:
            layer.prism_signs = layer.prism_signs.to(layer.weight.device)
        layer.prism_uses_op = self._uses_linear_kernels(layer) and _prepare_planes(
            layer, self.config)

    def _uses_linear_kernels(self, layer: torch.nn.Module) -> bool:
        return True

    def apply(self, layer: torch.nn.Module, x: torch.Tensor,
              bias: torch.Tensor | None = None) -> torch.Tensor:
        if layer.prism_uses_op:
            return torch.ops.vllm_prism.pq2_linear(x, layer.prism_codes, layer.prism_scales,
                                                   layer.prism_signs, bias,
                                                   self.config.hadamard_block or 0)
        return prism_linear_reference(x, layer.weight, layer.prism_signs, self.config, bias)

    @staticmethod
    def fuses_prologue(layer: torch.nn.Module) -> bool:
        """Whether the layer runs the linear op, whose producer can take the SiLU-and-multiply,
        the residual add + RMSNorm or an output gate in front (:meth:`apply_glu`,
        :meth:`apply_add_rmsnorm`, :meth:`apply_gated`).
        Decided once, when the weights are prepared."""
        return bool(getattr(layer, "prism_uses_op", False))

    def apply_glu(self, layer: torch.nn.Module, gate_up: torch.Tensor,
                  bias: torch.Tensor | None = None) -> torch.Tensor:
        """``apply(layer, silu(gate) * up)`` for gate_up = [..., 2K], in one producer launch."""
        return torch.ops.vllm_prism.pq2_glu_linear(gate_up, layer.prism_codes,
                                                   layer.prism_scales, layer.prism_signs, bias,
                                                   self.config.hadamard_block or 0)

    def apply_add_rmsnorm(self, layer: torch.nn.Module, x: torch.Tensor,
                          residual: torch.Tensor, rms_weight: torch.Tensor, rms_offset: float,
                          eps: float, bias: torch.Tensor | None = None,
                          return_input: bool = False) -> tuple[torch.Tensor, ...]:
        """``(apply(layer, RMSNorm(x + residual)), x + residual)``, the norm and the residual
        add in the producer launch (``rms_offset`` 1.0: the zero-centred ``(1 + w)`` norm);
        ``return_input`` appends ``RMSNorm(x + residual)`` in x's dtype, stored by the same
        launch."""
        op = (torch.ops.vllm_prism.pq2_add_rmsnorm_linear_input if return_input
              else torch.ops.vllm_prism.pq2_add_rmsnorm_linear)
        return op(x, residual, rms_weight, rms_offset, eps, layer.prism_codes,
                  layer.prism_scales, layer.prism_signs, bias, self.config.hadamard_block or 0)

    def apply_gated(self, layer: torch.nn.Module, x: torch.Tensor, gate: torch.Tensor,
                    gate_sigmoid: bool, rms_weight: torch.Tensor | None = None,
                    rms_group: int = 0, eps: float = 1e-6,
                    bias: torch.Tensor | None = None) -> torch.Tensor:
        """``apply(layer, RMSNorm?(x) * act(gate))`` in one producer launch: act is sigmoid
        (``gate_sigmoid``) or silu; the optional RMSNorm (``rms_weight``) normalizes every
        ``rms_group`` elements (a head) on its own."""
        return torch.ops.vllm_prism.pq2_gated_linear(
            x, gate, rms_weight, rms_group, eps, gate_sigmoid, layer.prism_codes,
            layer.prism_scales, layer.prism_signs, bias, self.config.hadamard_block or 0)


class PrismEmbeddingMethod(PrismLinearMethod):
    """Embedding lookup (then the inverse transform) and the folded LM head."""

    def _uses_linear_kernels(self, layer: torch.nn.Module) -> bool:
        # The LM head is a linear layer; the input embedding only gathers packed rows.
        from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

        return isinstance(layer, ParallelLMHead)

    def embedding(self, layer: torch.nn.Module, input_: torch.Tensor) -> torch.Tensor:
        cfg = self.config
        rows = layer.weight.index_select(0, input_.reshape(-1))
        group = cfg.group if cfg.ggml_type == GGMLType.Q2_0 else None
        z = dequantize_to(rows, cfg.ggml_type, torch.float32, group=group)
        if layer.prism_signs is not None:
            z = inverse_signed_hadamard_torch(z, layer.prism_signs, cfg.hadamard_block)
        return z.to(layer.prism_out_dtype).reshape(*input_.shape, -1)


def _prepare_planes(layer: torch.nn.Module, config: PrismConfig) -> bool:
    """Replace the layer's GGUF rows by the one prepared form the linear op reads (int32
    codes and fp16 scales, see kernels/pq2/layout.py), once after loading, on every device.

    PQ2_0 and legacy Q2_0/g128 share the 34-byte block. PTQ1_0 is transcoded losslessly to
    the same planes here, so each layer holds one form: the kernels for every M read it, and
    nothing is built on a later call. Returns False (the torch reference path) for block
    types without planes (legacy Q2_0 with 64-element groups).
    """
    from vllm_prism.kernels.pq2.layout import PQ2Weight, note_ternary_plane

    raw = layer.weight.data
    if config.ggml_type == GGMLType.PTQ1_0:
        w = PQ2Weight.from_ptq1_raw(raw, signs=layer.prism_signs,
                                    hadamard_block=config.hadamard_block)
    elif config.layout.type_size == 34:
        w = PQ2Weight.from_raw(raw, signs=layer.prism_signs,
                               hadamard_block=config.hadamard_block)
    else:
        logger.warning_once("no prepared layout for %s/g%d; the torch reference path runs",
                            config.ggml_type.name, config.group)
        return False
    _register_ops()
    layer.register_parameter("prism_codes", Parameter(w.codes, requires_grad=False))
    layer.register_parameter("prism_scales", Parameter(w.scales, requires_grad=False))
    if w.ternary:  # the Parameter keeps the plane's record (w.codes goes with w)
        note_ternary_plane(layer.prism_codes)
    layer.weight.data = torch.empty(0, dtype=torch.uint8, device=raw.device)
    return True


def _register_ops() -> None:
    from vllm_prism._custom_ops import register_ops

    register_ops()


def prism_linear_reference(x: torch.Tensor, packed: torch.Tensor, signs: torch.Tensor | None,
                           config: PrismConfig, bias: torch.Tensor | None = None
                           ) -> torch.Tensor:
    """The exact torch computation y = W_st · Hblk(s ⊙ x) (+ bias), in float32."""
    xf = x.float()
    if signs is not None:
        xf = signed_hadamard_torch(xf, signs, config.hadamard_block)
    group = config.group if config.ggml_type == GGMLType.Q2_0 else None
    w = dequantize_to(packed, config.ggml_type, torch.float32, group=group)
    y = torch.nn.functional.linear(xf, w, None if bias is None else bias.float())
    return y.to(x.dtype)
