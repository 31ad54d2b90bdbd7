"""The Bonsai (GGUF architecture qwen35) causal LM, built from vLLM's Qwen3-Next layers.

The text model is vLLM's Qwen3.5: Gated DeltaNet layers and gated full-attention layers
(3:1), a dense SiLU MLP, zero-centred RMSNorms. vLLM's own qwen3_5 module also defines the
vision model and imports torchvision through it, which a CPU install cannot import; this
module composes the same layers from qwen3_next and the Gated DeltaNet layer directly, and
adds what Bonsai needs: the quantization config reaches the embedding too (it is ternary
and inverse-folded in Bonsai files), and where the projections run the prism linear op, what
feeds them runs inside their activation producers, not as kernels of its own: the
post-attention residual add + RMSNorm and the SiLU-and-multiply (``gate_up_proj``,
``down_proj``: :class:`BonsaiMLP`), the input residual add + RMSNorm and the output gate of
the full-attention layers (``qkv_proj``, ``o_proj``: :class:`BonsaiAttention`), and the Gated
DeltaNet's input residual add + RMSNorm (``in_proj_qkvz``, whose producer also returns the
normalized input for the float ``in_proj_ba``) and gated per-head RMSNorm (``out_proj``:
:class:`BonsaiGatedDeltaNet`). Tensor and
pipeline parallelism work where vLLM's layers support them.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn
from vllm.compilation.decorators import support_torch_compile
from vllm.config import VllmConfig
from vllm.distributed import get_pp_group, tensor_model_parallel_all_reduce
from vllm.forward_context import get_forward_context
from vllm.logger import init_logger
from vllm.model_executor.layers.layernorm import GemmaRMSNorm
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import \
    QwenGatedDeltaNetAttention
from vllm.model_executor.layers.mamba.mamba_utils import (MambaStateCopyFuncCalculator,
                                                          MambaStateDtypeCalculator,
                                                          MambaStateShapeCalculator,
                                                          is_conv_state_dim_first)
from vllm.model_executor.layers.mamba.ops.causal_conv1d import causal_conv1d_update
from vllm.model_executor.layers.vocab_parallel_embedding import (ParallelLMHead,
                                                                 VocabParallelEmbedding)
from vllm.model_executor.models.interfaces import (HasInnerState, IsHybrid, SupportsEagle3,
                                                   SupportsPP)
from vllm.model_executor.models.qwen2_moe import Qwen2MoeMLP
from vllm.model_executor.models.qwen3_next import (Qwen3NextAttention, Qwen3NextDecoderLayer,
                                                   Qwen3NextModel)
from vllm.model_executor.models.utils import (AutoWeightsLoader, PPMissingLayer,
                                              WeightsMapper, extract_layer_index,
                                              make_empty_intermediate_tensors_factory,
                                              make_layers, maybe_prefix)
from vllm.sequence import IntermediateTensors
from vllm.utils.torch_utils import _encode_layer_name
from vllm.v1.attention.backends.gdn_attn import GDNAttentionMetadata

from vllm_prism import envs
from vllm_prism.kernels.gdn_verify import gdn_verify_problem, launch_gdn_verify
from vllm_prism.model_executor.layers.quantization.prism import PrismFloatLinearMethod

logger = init_logger(__name__)


def _fuses(layer: nn.Module) -> bool:
    """Whether ``layer`` runs the prism op without a bias (known once the weights are
    prepared), so that what feeds it can run in its activation producer."""
    method = getattr(layer, "quant_method", None)
    return (bool(getattr(method, "fuses_prologue", lambda _: False)(layer))
            and getattr(layer, "bias", None) is None)


def _reduce(layer: nn.Module, out: torch.Tensor) -> torch.Tensor:
    """The all-reduce a RowParallelLinear's forward does after its matmul."""
    if layer.reduce_results and layer.tp_size > 1:
        return tensor_model_parallel_all_reduce(out)
    return out


class BonsaiAttention(Qwen3NextAttention):
    """Gated full attention; the output gate ``* sigmoid(gate)`` runs in o_proj's producer,
    and :meth:`forward_add_norm` also runs the input residual add + RMSNorm in qkv_proj's."""

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        if not _fuses(self.o_proj):
            return super().forward(positions, hidden_states)
        return self._attend(positions, self.qkv_proj(hidden_states)[0])

    def fuses_input_norm(self) -> bool:
        return _fuses(self.qkv_proj) and _fuses(self.o_proj)

    def forward_add_norm(self, positions: torch.Tensor, x: torch.Tensor,
                         residual: torch.Tensor, norm: GemmaRMSNorm
                         ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(attention(norm(x + residual)), x + residual)``; the add and the norm run in
        qkv_proj's producer."""
        qkv, residual = self.qkv_proj.quant_method.apply_add_rmsnorm(
            self.qkv_proj, x, residual, norm.weight, 1.0, norm.variance_epsilon)
        return self._attend(positions, qkv), residual

    def _attend(self, positions: torch.Tensor, qkv: torch.Tensor) -> torch.Tensor:
        q, k, v, gate = self._project_qkv_gate(qkv, positions)
        attn_output = self.attn(q, k, v)
        if gate is None:
            return self.o_proj(attn_output)[0]
        out = self.o_proj.quant_method.apply_gated(self.o_proj, attn_output, gate,
                                                   gate_sigmoid=True)
        return _reduce(self.o_proj, out)


class BonsaiGatedDeltaNet(QwenGatedDeltaNetAttention):
    """Gated DeltaNet; the gated per-head RMSNorm of its output runs in out_proj's producer,
    and :meth:`forward_add_norm` also runs the input residual add + RMSNorm in
    in_proj_qkvz's, whose launch returns the normalized input for the float ``in_proj_ba``."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        # the platform forward vLLM picked, whose core op forward_add_norm calls (or None)
        self.prism_core = ("cuda" if self._forward_method == self.forward_cuda else
                           "cpu" if self._forward_method == self.forward_cpu else None)
        # verification steps on kernels/gdn_verify.py (VLLM_PRISM_GDN_VERIFY=prism, the
        # default): vLLM's fused branch off, so that its core op reaches _forward_core
        self.prism_verify = (envs.VLLM_PRISM_GDN_VERIFY == "prism"
                             and self.speculative_config is not None
                             and self.prism_core == "cuda" and not self.gqa_interleaved_layout)
        if self.prism_verify:
            self.gdn_decode_kernel = "triton"
            self.enable_fused_gdn_spec_decode = False
            logger.info_once("Bonsai: the Gated DeltaNet of verification steps on vllm-prism's "
                             "kernel (VLLM_PRISM_GDN_VERIFY=prism)")

    def fuses_input_norm(self) -> bool:
        """Whether :meth:`forward_add_norm` can take the input norm: in_proj_qkvz runs the prism
        op, in_proj_ba the float method without bias or replication, the Qwen3.5 layout, no
        LoRA, and vLLM's CUDA or CPU forward (whose core ops it calls)."""
        ba = self.in_proj_ba
        return (self.prism_core is not None and _fuses(self.in_proj_qkvz)
                and isinstance(ba.quant_method, PrismFloatLinearMethod)
                and getattr(ba, "bias", None) is None and not self.gqa_interleaved_layout
                and not self.disable_tp_for_ba_proj and not hasattr(self, "in_proj_qkv"))

    def forward_add_norm(self, x: torch.Tensor, residual: torch.Tensor, norm: GemmaRMSNorm
                         ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(gdn(norm(x + residual)), x + residual)``: vLLM's forward_cuda / forward_cpu with
        the add and the norm in in_proj_qkvz's producer (which also stores the normalized
        input for in_proj_ba) and, on CUDA, ``b``, ``a`` and the zeroed core output from
        in_proj_ba's launch (:meth:`PrismFloatLinearMethod.apply_halves`), instead of a norm,
        a copy and a fill kernel of their own."""
        method = self.in_proj_qkvz.quant_method
        mixed_qkvz, residual, normed = method.apply_add_rmsnorm(
            self.in_proj_qkvz, x, residual, norm.weight, 1.0, norm.variance_epsilon,
            return_input=True)
        n = x.size(0)
        heads = self.num_v_heads // self.tp_size
        layer_name = _encode_layer_name(self.prefix)
        on_cuda = self.prism_core == "cuda"
        if on_cuda and (self.enable_fused_gdn_spec_decode and x.dtype == torch.bfloat16
                        and self.norm.weight.dtype in (torch.bfloat16, torch.float32)):
            ba, _ = self.in_proj_ba(normed)
            core_attn_out = torch.zeros((n, heads, self.head_v_dim), dtype=x.dtype,
                                        device=x.device)
            torch.ops.vllm.qwen_gdn_attention_core_fused_norm_packed(
                mixed_qkvz, ba, core_attn_out, layer_name=layer_name)
            output, _ = self.out_proj(core_attn_out.flatten(-2))
            return output, residual
        ba, core_attn_out = self.in_proj_ba.quant_method.apply_halves(
            self.in_proj_ba, normed, heads * self.head_v_dim)
        core_attn_out = core_attn_out.view(n, heads, self.head_v_dim)
        qkv_size = (self.key_dim * 2 + self.value_dim) // self.tp_size
        mixed_qkv, z = mixed_qkvz.split([qkv_size, self.value_dim // self.tp_size], dim=-1)
        z = z.reshape(z.size(0), -1, self.head_v_dim)
        if on_cuda:
            torch.ops.vllm.qwen_gdn_attention_core(mixed_qkv, ba[0], ba[1], core_attn_out,
                                                   layer_name=layer_name)
        else:
            torch.ops.vllm.cpu_gdn_attention_core(mixed_qkv, ba[0], ba[1], core_attn_out,
                                                  layer_name)
        return self._output_projection(core_attn_out, z), residual

    def _forward_core(self, mixed_qkv: torch.Tensor, b: torch.Tensor, a: torch.Tensor,
                      core_attn_out: torch.Tensor) -> None:
        """vLLM's convolution + recurrence (called by its core op), with a step of only
        verification sequences on :func:`gdn_verify` where ``prism_verify`` is set: the
        convolution as vLLM runs it for them, then the recurrence reading its output rows,
        ``a`` and ``b`` in place and writing ``core_attn_out``."""
        meta = self._verification_only() if self.prism_verify else None
        if meta is None:
            return super()._forward_core(mixed_qkv=mixed_qkv, b=b, a=a,
                                         core_attn_out=core_attn_out)
        heads = self.num_k_heads // self.tp_size
        problem = gdn_verify_problem(mixed_qkv, a, b, self.kv_cache[1],
                                     meta.spec_state_indices_tensor, core_attn_out, heads,
                                     self.head_k_dim, self.head_v_dim)
        if problem is not None:
            logger.warning_once("VLLM_PRISM_GDN_VERIFY=prism: vLLM's core runs the "
                                "verification steps: %s", problem)
            return super()._forward_core(mixed_qkv=mixed_qkv, b=b, a=a,
                                         core_attn_out=core_attn_out)
        conv_state = self.kv_cache[0]
        if not is_conv_state_dim_first():
            conv_state = conv_state.transpose(-1, -2)
        weight = self.conv1d.weight
        indices = meta.spec_state_indices_tensor
        n = meta.num_actual_tokens
        qkv = causal_conv1d_update(
            mixed_qkv[:n], conv_state, weight.view(weight.size(0), weight.size(2)),
            self.conv1d.bias, self.activation,
            conv_state_indices=indices[:, 0][:meta.num_spec_decodes],
            num_accepted_tokens=meta.num_accepted_tokens,
            query_start_loc=meta.spec_query_start_loc, max_query_len=indices.size(-1),
            validate_data=False)
        launch_gdn_verify(qkv, a, b, self.A_log, self.dt_bias, self.kv_cache[1], indices,
                          meta.num_accepted_tokens,
                          meta.spec_query_start_loc[:meta.num_spec_decodes + 1],
                          core_attn_out, heads, self.head_k_dim, self.head_v_dim)

    def _verification_only(self) -> GDNAttentionMetadata | None:
        """This layer's metadata when the step holds verification sequences only (no prefill,
        no plain decode), else None."""
        meta = get_forward_context().attn_metadata
        meta = meta.get(self.prefix) if isinstance(meta, dict) else None
        if (isinstance(meta, GDNAttentionMetadata) and meta.spec_sequence_masks is not None
                and meta.num_prefills == 0 and meta.num_decodes == 0
                and meta.spec_state_indices_tensor is not None
                and meta.num_accepted_tokens is not None):
            return meta
        return None

    def _output_projection(self, core_attn_out: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        norm = self.norm
        d = self.head_v_dim
        if not (_fuses(self.out_proj) and norm.group_size is None and norm.norm_before_gate
                and norm.activation in ("silu", "swish", "sigmoid") and d & (d - 1) == 0
                and d <= 1024):
            return super()._output_projection(core_attn_out, z)
        x = core_attn_out.flatten(-2)
        out = self.out_proj.quant_method.apply_gated(
            self.out_proj, x, z.reshape(x.shape), gate_sigmoid=norm.activation == "sigmoid",
            rms_weight=norm.weight, rms_group=d, eps=norm.eps)
        return _reduce(self.out_proj, out)


class BonsaiMLP(Qwen2MoeMLP):
    """The dense SiLU MLP; :meth:`forward_add_norm` also takes the post-attention norm."""

    def fuses_prologue(self) -> bool:
        """Whether both projections run the prism op, so that the norm and the activation
        can run in their producers."""
        return _fuses(self.gate_up_proj) and _fuses(self.down_proj)

    def forward_add_norm(self, x: torch.Tensor, residual: torch.Tensor, norm: GemmaRMSNorm
                         ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(mlp(norm(x + residual)), x + residual)`` in two launches (plus the reduce under
        tensor parallelism): the add and norm in gate_up_proj's producer, the SiLU-and-multiply
        in down_proj's."""
        gate_up, residual = self.gate_up_proj.quant_method.apply_add_rmsnorm(
            self.gate_up_proj, x, residual, norm.weight, 1.0, norm.variance_epsilon)
        out = self.down_proj.quant_method.apply_glu(self.down_proj, gate_up)
        return _reduce(self.down_proj, out), residual


class BonsaiDecoderLayer(Qwen3NextDecoderLayer):
    """One Qwen3.5 text layer: GDN or gated attention, then the dense MLP."""

    def __init__(self, vllm_config: VllmConfig, layer_type: str, prefix: str = "") -> None:
        nn.Module.__init__(self)
        config = vllm_config.model_config.hf_text_config
        quant_config = vllm_config.quant_config
        self.layer_type = layer_type
        self.layer_idx = extract_layer_index(prefix)
        self.use_attn_reduce_scatter_for_moe = False
        self.layer_scale = False
        if layer_type == "linear_attention":
            self.linear_attn = BonsaiGatedDeltaNet(
                config=config, vllm_config=vllm_config, prefix=f"{prefix}.linear_attn",
                gqa_interleaved_layout=False)
        elif layer_type == "full_attention":
            self.self_attn = BonsaiAttention(
                config, model_config=vllm_config.model_config,
                cache_config=vllm_config.cache_config, quant_config=quant_config,
                prefix=f"{prefix}.self_attn")
        else:
            raise ValueError(f"layer {self.layer_idx}: unknown layer type {layer_type!r}")
        self.mlp = BonsaiMLP(hidden_size=config.hidden_size,
                             intermediate_size=config.intermediate_size,
                             hidden_act=config.hidden_act, quant_config=quant_config,
                             prefix=f"{prefix}.mlp")
        self.input_layernorm = GemmaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = GemmaRMSNorm(config.hidden_size,
                                                     eps=config.rms_norm_eps)

    def forward(self, hidden_states: torch.Tensor, residual: torch.Tensor | None,
                positions: torch.Tensor, **kwargs: object
                ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.mlp.fuses_prologue():
            return super().forward(hidden_states, residual, positions, **kwargs)
        if (residual is not None and self.layer_type == "full_attention"
                and self.self_attn.fuses_input_norm()):
            hidden_states, residual = self.self_attn.forward_add_norm(
                positions, hidden_states, residual, self.input_layernorm)
        elif (residual is not None and self.layer_type == "linear_attention"
              and self.linear_attn.fuses_input_norm()):
            hidden_states, residual = self.linear_attn.forward_add_norm(
                hidden_states, residual, self.input_layernorm)
        else:
            if residual is None:
                residual = hidden_states
                hidden_states = self.input_layernorm(hidden_states)
            else:
                hidden_states, residual = self.input_layernorm(hidden_states, residual)
            if self.layer_type == "linear_attention":
                hidden_states = self.linear_attn(hidden_states=hidden_states)
            else:
                hidden_states = self.self_attn(hidden_states=hidden_states,
                                               positions=positions)
        return self.mlp.forward_add_norm(hidden_states, residual,
                                         self.post_attention_layernorm)


@support_torch_compile(dynamic_arg_dims={"input_ids": 0, "positions": -1,
                                         "intermediate_tensors": 0, "inputs_embeds": 0})
class BonsaiModel(Qwen3NextModel):
    """Embedding (quantized, inverse-folded), the layer stack and the final norm."""

    # Hugging Face Qwen3.5 names -> vLLM's fused projections.
    hf_to_vllm_mapper = Qwen3NextModel.hf_to_vllm_mapper | WeightsMapper(
        orig_to_new_stacked={
            ".in_proj_qkv": (".in_proj_qkvz", (0, 1, 2)),
            ".in_proj_z": (".in_proj_qkvz", 3),
            ".in_proj_b": (".in_proj_ba", 0),
            ".in_proj_a": (".in_proj_ba", 1),
        })

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        nn.Module.__init__(self)
        config = vllm_config.model_config.hf_text_config
        self.config = config
        self.quant_config = vllm_config.quant_config
        self.num_redundant_experts = 0
        self.vocab_size = config.vocab_size
        self.embed_tokens = VocabParallelEmbedding(
            self.vocab_size, config.hidden_size, quant_config=self.quant_config,
            prefix=maybe_prefix(prefix, "embed_tokens"))

        def get_layer(prefix: str) -> BonsaiDecoderLayer:
            kind = config.layer_types[extract_layer_index(prefix)]
            return BonsaiDecoderLayer(vllm_config, layer_type=kind, prefix=prefix)

        self.start_layer, self.end_layer, self.layers = make_layers(
            config.num_hidden_layers, get_layer, prefix=f"{prefix}.layers")
        self.is_fused_shared_expert_enabled = False
        self.make_empty_intermediate_tensors = make_empty_intermediate_tensors_factory(
            ["hidden_states", "residual"], config.hidden_size)
        if get_pp_group().is_last_rank:
            self.norm = GemmaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        else:
            self.norm = PPMissingLayer()
        self.aux_hidden_state_layers: tuple[int, ...] = ()

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return AutoWeightsLoader(self).load_weights(weights, mapper=self.hf_to_vllm_mapper)


class PrismBonsaiForCausalLM(nn.Module, HasInnerState, IsHybrid, SupportsPP, SupportsEagle3):
    """Bonsai causal LM: BonsaiModel plus the (folded, ternary) LM head; the architecture
    name the GGUF config source writes (transformers_utils.gguf_config.ARCHITECTURE).
    SupportsEagle3: the hidden states after chosen layers feed EAGLE-3 / DFlash drafters
    (Qwen3NextModel collects them)."""

    packed_modules_mapping = {
        "qkv_proj": ["q_proj", "k_proj", "v_proj"],
        "gate_up_proj": ["gate_proj", "up_proj"],
        "in_proj_qkvz": ["in_proj_qkv", "in_proj_z"],
        "in_proj_ba": ["in_proj_b", "in_proj_a"],
    }

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        config = vllm_config.model_config.hf_text_config
        self.config = config
        self.vllm_config = vllm_config
        self.quant_config = vllm_config.quant_config
        self.model = BonsaiModel(vllm_config=vllm_config, prefix=maybe_prefix(prefix, "model"))
        if get_pp_group().is_last_rank:
            self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size,
                                          quant_config=self.quant_config,
                                          prefix=maybe_prefix(prefix, "lm_head"))
        else:
            self.lm_head = PPMissingLayer()
        self.logits_processor = LogitsProcessor(config.vocab_size)
        self.make_empty_intermediate_tensors = self.model.make_empty_intermediate_tensors

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_input_ids(input_ids)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                intermediate_tensors: IntermediateTensors | None = None,
                inputs_embeds: torch.Tensor | None = None, **kwargs: object
                ) -> torch.Tensor | IntermediateTensors:
        return self.model(input_ids, positions, intermediate_tensors, inputs_embeds)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        return self.logits_processor(self.lm_head, hidden_states)

    @classmethod
    def get_mamba_state_dtype_from_config(cls, vllm_config: VllmConfig
                                          ) -> tuple[torch.dtype, torch.dtype]:
        cache = vllm_config.cache_config
        return MambaStateDtypeCalculator.gated_delta_net_state_dtype(
            vllm_config.model_config.dtype, cache.mamba_cache_dtype, cache.mamba_ssm_cache_dtype)

    @classmethod
    def get_mamba_state_shape_from_config(cls, vllm_config: VllmConfig
                                          ) -> tuple[tuple[int, int], tuple[int, int]]:
        cfg = vllm_config.model_config.hf_text_config
        spec = vllm_config.speculative_config
        return MambaStateShapeCalculator.gated_delta_net_state_shape(
            vllm_config.parallel_config.tensor_parallel_size, cfg.linear_num_key_heads,
            cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim,
            cfg.linear_conv_kernel_dim, spec.num_speculative_tokens if spec else 0)

    @classmethod
    def get_mamba_state_copy_func(cls) -> tuple:
        return MambaStateCopyFuncCalculator.gated_delta_net_state_copy_func()

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return AutoWeightsLoader(self).load_weights(weights)
