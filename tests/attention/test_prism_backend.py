"""The PRISM attention backend's forward, with vLLM's Triton metadata as the builder makes it
(padded persistent buffers) and a batch mixing decode, verification and prefill requests,
against the fp32 reference on the dequantised cache. CPU, Triton interpreter."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("triton")
pytest.importorskip("vllm.v1.attention.backends.triton_attn")

HERE = Path(__file__).resolve().parent
# bf16 queries and outputs against an fp32 reference: relative error of bf16 rounding
# (plus INT8 quantisation of K/V, which the reference sees dequantised, so it cancels).
TOL = 1e-2


@pytest.fixture(scope="module")
def errors(triton_interpreter) -> dict:
    out = triton_interpreter(HERE / "backend_checks.py", timeout=900)
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.parametrize("kv", ["int8", "bf16", "int8_noncausal", "bf16_noncausal"])
def test_backend_forward_matches_reference(errors: dict, kv: str) -> None:
    """``*_noncausal``: a DFlash drafter's step (6-token blocks and a decoding request, each
    token against its request's whole sequence) against the reference without the mask."""
    assert errors[kv] < TOL, errors


@pytest.mark.parametrize("kv", ["int8_fresh", "bf16_fresh"])
def test_prefill_at_context_0_attends_to_the_steps_own_kv(errors: dict, kv: str) -> None:
    """A prompt's first chunk attends to the K and V vLLM passes the forward (one causal call,
    no read-back from the cache); VLLM_PRISM_PREFILL_FRESH_KV=0 reads the cache instead. The
    two references differ by far more than the tolerance on this batch, so each can fail."""
    e = errors[kv]
    assert e["1"] < TOL and e["0"] < TOL, e
    assert e["fresh_vs_cache_reference"] > 10 * TOL, e


def test_the_noncausal_reference_differs_from_the_causal_one() -> None:
    """The non-causal check can fail: on its batch the two references disagree by far more
    than the tolerance, so a kernel that kept the causal mask would not pass it."""
    import sys

    import torch

    sys.path.insert(0, str(HERE))
    from attn_helpers import make_batch, rel_err

    from vllm_prism.attention.ops.reference import reference_attention

    b = make_batch([37, 70, 150, 21], [6, 6, 1, 6], torch.bfloat16, block_size=16)
    args = (b.q, b.cache, b.block_table, b.seq_lens, b.md.query_start_loc_cpu)
    assert rel_err(reference_attention(*args, causal=False), reference_attention(*args)) > 10 * TOL


def test_registered_and_selectable() -> None:
    from vllm.config.attention import AttentionConfig
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    from vllm_prism.attention.backends.prism_attn import register_attention_backend

    register_attention_backend()
    backend = AttentionConfig.validate_backend_before("PRISM")
    assert backend is AttentionBackendEnum["PRISM"]
    cls = backend.get_class()
    assert cls.get_name() == "PRISM"
    assert cls.supports_kv_cache_dtype("int8_per_token_head")


def test_custom_member_survives_a_fresh_process() -> None:
    """vLLM's engine-core process unpickles the engine config before it loads plugins: the
    backend travels as the CUSTOM member (a plain member everywhere), and resolves to our
    class once the plugin has registered it."""
    import pickle
    import subprocess
    import sys

    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    from vllm_prism.attention.backends.prism_attn import (PrismAttentionBackend,
                                                          register_attention_backend)

    register_attention_backend()
    member = AttentionBackendEnum.CUSTOM
    assert member.get_class() is PrismAttentionBackend
    blob = pickle.dumps(member).hex()
    code = ("import pickle, sys; m = pickle.loads(bytes.fromhex(sys.argv[1])); "
            "from vllm.plugins import load_general_plugins; load_general_plugins(); "
            "print(m.name, m.get_class().get_name())")
    res = subprocess.run([sys.executable, "-c", code, blob], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split()[-2:] == ["CUSTOM", "PRISM"]


def test_long_non_causal_chunks_go_to_the_triton_backend(monkeypatch) -> None:
    """A non-causal chunk longer than the split path's 16 tokens a request runs vLLM's Triton
    attention, which honours ``causal=False``; shorter blocks stay with our kernels."""
    import types

    import torch
    from vllm.v1.attention.backends.triton_attn import TritonAttentionImpl

    from vllm_prism.attention.backends import prism_attn
    from vllm_prism.attention.backends.prism_attn import PrismAttentionImpl
    from vllm_prism.attention.ops.mixed import StepPlan

    calls = []
    monkeypatch.setattr(TritonAttentionImpl, "forward",
                        lambda self, *a, **k: calls.append("triton") or a[-1])
    monkeypatch.setattr(prism_attn, "mixed_attention",
                        lambda *a, **k: calls.append(("prism", k["causal"])))
    impl = object.__new__(PrismAttentionImpl)
    impl.prism_supported = lambda: (True, "")
    impl._is_per_token_head_quant = False
    impl.scale = 0.125
    out = torch.zeros(2, 4, 64)
    for lens in ([17], [6, 6]):
        md = types.SimpleNamespace(causal=False, num_actual_tokens=sum(lens), prism=None,
                                   prism_plan=StepPlan.build(lens, torch.device("cpu")))
        impl.forward(None, out, out, out, None, md, out)
    assert calls == ["triton", ("prism", False)]


def test_prefill_reads_vllms_host_lengths_not_the_device() -> None:
    """The builder hands vLLM's host upper bound on the sequence lengths (exact for prefill
    rows) to our metadata, so the prefill path's host read of the lengths copies nothing from
    the device (that copy stalled the GPU in the middle of every step with a prefill in it).
    Meta tensors have no data: any device read fails."""
    from types import SimpleNamespace

    import torch

    from vllm_prism.attention.backends.prism_attn import prism_metadata

    meta = lambda *shape: torch.empty(*shape, dtype=torch.int32, device="meta")  # noqa: E731
    md = SimpleNamespace(block_table=meta(4, 8), seq_lens=meta(4), query_start_loc=meta(5),
                         max_query_len=40, max_seq_len=90)
    qsl = torch.tensor([0, 1, 41, 42, 42], dtype=torch.int32)  # the last request: padding
    upper = torch.tensor([17, 90, 33, 0], dtype=torch.int32)
    pm = prism_metadata(md, 3, qsl, upper)
    assert pm.host() == ([0, 1, 41, 42], [17, 90, 33])
    assert pm.query_lens() == [1, 40, 1]
