"""The verification step's Gated DeltaNet kernel (vllm_prism/kernels/gdn_verify.py): its
output rows and stored states against an fp64 recurrence written from the model's equations
(to bf16 rounding) and against vLLM's Triton verification kernel on the copies vLLM makes
(to fp32 rounding), with strided inputs, several sequences, a padded sequence and a null
token slot left alone; in the Triton CPU interpreter, and on the GPU where there is one.
Bonsai's Gated DeltaNet core with VLLM_PRISM_GDN_VERIFY=prism takes a step of verification
sequences only and equals vLLM's core on it; the switch turns vLLM's fused branch off only
where the model has a drafter and runs vLLM's CUDA forward."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm")

HERE = Path(__file__).resolve().parent
# bf16 outputs and states against fp64: about 2^-8 relative
REF_TOL = 8e-3
# the same fp32 arithmetic as vLLM's kernel, in another order on a GPU
VLLM_TOL = 2e-3


def _check(errors: dict) -> None:
    assert len(errors) == 3, errors
    for case, err in errors.items():
        assert err["ref_out"] < REF_TOL and err["ref_state"] < REF_TOL, (case, err)
        assert err["vllm_out"] < VLLM_TOL and err["vllm_state"] < VLLM_TOL, (case, err)
        assert err["untouched"] and err["no_prefetch_same"], case


def test_interpreter_matches_the_references(triton_interpreter) -> None:
    _check(json.loads(triton_interpreter(HERE / "gdn_verify_checks.py", timeout=600)))


@pytest.mark.gpu
def test_gpu_matches_the_references() -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    sys.path.insert(0, str(HERE))
    import gdn_verify_checks

    _check(gdn_verify_checks.run("cuda"))


def test_layer_core_equals_vllms(triton_interpreter) -> None:
    """gdn_verify_layer_checks.py: the prism core on a verification step against vLLM's core
    (bit for bit), the convolution called alike, other steps left to vLLM's core."""
    result = json.loads(triton_interpreter(HERE / "gdn_verify_layer_checks.py", timeout=600))
    assert len(result) == 2, result
    for case, r in result.items():
        assert r == {"out": 0.0, "conv_args": True, "ssm_state": 0.0, "routed": True,
                     "fallback": True}, (case, r)


def _gdn_layer(monkeypatch, picked: str, speculative: bool, cuda: bool = True):
    """A BonsaiGatedDeltaNet whose vLLM constructor is replaced by one that only sets what
    vLLM 0.32's sets for the verification kernel choice and the platform forward."""
    from torch import nn
    from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import \
        QwenGatedDeltaNetAttention

    from vllm_prism.model_executor.models.bonsai import BonsaiGatedDeltaNet

    def init(self, *args, **kwargs) -> None:
        nn.Module.__init__(self)
        self.speculative_config = object() if speculative else None
        self.gdn_decode_kernel = picked
        self.enable_fused_gdn_spec_decode = picked == "cuda" and speculative
        self.gqa_interleaved_layout = False
        self._forward_method = self.forward_cuda if cuda else self.forward_cpu

    monkeypatch.setattr(QwenGatedDeltaNetAttention, "__init__", init)
    return BonsaiGatedDeltaNet()


@pytest.mark.parametrize("switch, speculative, cuda, prism", [
    (None, True, True, True),  # the default
    ("prism", True, True, True),
    ("vllm", True, True, False),  # vLLM's choice stands
    ("prism", False, True, False),  # no drafter, no verification steps
    ("prism", True, False, False),  # the CPU forward has its own core
])
def test_the_switch_routes_verification_steps(monkeypatch, switch: str | None,
                                              speculative: bool, cuda: bool,
                                              prism: bool) -> None:
    if switch is None:
        monkeypatch.delenv("VLLM_PRISM_GDN_VERIFY", raising=False)
    else:
        monkeypatch.setenv("VLLM_PRISM_GDN_VERIFY", switch)
    layer = _gdn_layer(monkeypatch, "cuda", speculative, cuda)
    assert layer.prism_verify == prism
    # vLLM's fused verification branch (forward_add_norm's too) is off where the prism core
    # takes the steps, and as vLLM set it elsewhere
    assert layer.enable_fused_gdn_spec_decode == (speculative and not prism)
    assert layer.gdn_decode_kernel == ("triton" if prism else "cuda")


def test_refusals_name_the_problem() -> None:
    from vllm_prism.kernels.gdn_verify import gdn_verify

    state = torch.zeros(3, 4, 64, 64)
    idx = torch.ones(1, 2, dtype=torch.int32)
    qkv = torch.zeros(2, 2 * 2 * 64 + 4 * 64)
    with pytest.raises(ValueError, match="gdn_verify: 4 value heads are not a multiple of 3"):
        gdn_verify(qkv, qkv, qkv, qkv, qkv, state, idx, idx, idx, torch.zeros(2, 4, 64),
                   3, 64, 64)
    with pytest.raises(ValueError, match="the key head size 48"):
        gdn_verify(qkv, qkv, qkv, qkv, qkv, state, idx, idx, idx, torch.zeros(2, 4, 64),
                   2, 48, 64)
    with pytest.raises(ValueError, match="the state pool"):
        gdn_verify(qkv, qkv, qkv, qkv, qkv, state[:, :2], idx, idx, idx,
                   torch.zeros(2, 4, 64), 2, 64, 64)
    gates = torch.zeros(2, 8)
    for a, b in ((gates[:, ::2], gates[:, :4]), (gates[:, :4], gates[:1, :4])):
        with pytest.raises(ValueError, match=r"the gate input (a|b) .* not \[2 tokens, 4 heads\]"):
            gdn_verify(qkv, a, b, qkv, qkv, state, idx, idx, idx, torch.zeros(2, 4, 64),
                       2, 64, 64)
