"""DFlash speculative decoding with a Bonsai GGUF target on a CUDA GPU, in vLLM's default mode
(torch.compile, FULL_AND_PIECEWISE CUDA graphs), BF16 and INT8 KV caches.

Checked for k = 3 and 7: greedy output with speculation equals greedy output without it
(with the BF16 drafter, and with the drafter quantized online to fp8 at k = 3; the drafter's
config says 16 positions, fewer than the requests reach: patch dflash_draft_positions);
vLLM's counters show the tiny drafter accepted (first position far above chance); and the
verify steps (k + 1 tokens for every request) ran as full CUDA graphs: vLLM's CUDA-graph
dispatcher, recorded in the engine, chose FULL for uniform batches of k + 1 tokens a request;
with the INT8 cache the drafter's non-causal blocks ran the PRISM backend's split-KV path
(``VLLM_PRISM_DRAFT_ATTENTION=prism``, the default), and the verification calls the form of
the CUDA kernel that ``VLLM_PRISM_ATTN_VERIFY_FORM=auto`` serves on this GPU: the target has
the 27B's head size 256 (TARGET), so on compute capability 9.0 that is the warpgroup-MMA
form with its TMA producer, run on vLLM's own hybrid cache pool, and the greedy equality
checks it against the decode kernel's output.
Which kernels a verify step runs is logged by the engine (PQ2 linear kernel by M, and the
PRISM attention route) and printed here.
"""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("vllm")
pytest.importorskip("safetensors")

from dflash_runs import dflash_requests  # noqa: E402 (this folder is on sys.path)
from e2e.test_llm import run_vllm_all  # noqa: E402

from vllm_prism._custom_ops import has_compiled_op  # noqa: E402
from vllm_prism.attention.ops import cuda_decode  # noqa: E402
from vllm_prism.engine import step_record  # noqa: E402
from vllm_prism.gguf.tiny import TinyConfig, make_tiny_gguf  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

PROMPTS = [[5, 17, 42, 99], [300, 12, 7], [42, 43, 44, 45, 46]]
NEW_TOKENS = 24
KV = {"bf16": "auto", "int8": "int8_per_token_head"}
# PRISM_DFLASH_KV=int8 starts only the INT8 engines, PRISM_DFLASH_K=3 only the k = 3 engines
# besides the plain ones (a short device session); the tests of the others skip
SELECTED = os.environ.get("PRISM_DFLASH_KV", ",".join(KV)).split(",")
KS = tuple(int(k) for k in os.environ.get("PRISM_DFLASH_K", "3,7").split(","))


def _llm(kv: str) -> dict:
    return {"enforce_eager": False, "enable_prefix_caching": False, "max_model_len": 512,
            "gpu_memory_utilization": MEMORY_SHARE, "kv_cache_memory_bytes": 1 << 30,
            "kv_cache_dtype": KV[kv], "max_num_seqs": 8}


# (kv, k, drafter quantization): k = 0 is the plain run. All start at once, each engine in
# its own process with a slice of the GPU (their compiles overlap: one after another they
# outlived a 330 s slot on an H200).
RUNS = [run for run in [(kv, k, None) for kv in KV for k in (0, 3, 7)] + [("bf16", 3, "fp8")]
        if run[0] in SELECTED and run[1] in (0,) + KS]
MEMORY_SHARE = 0.1
# The tiny model with the 27B's attention head size (256; the tiny default, 64, has no
# warpgroup-MMA verification form, so the INT8 engines ran only the mma form in vLLM)
TARGET = TinyConfig(head_dim=256)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """``runs(kv, k, quant=None) -> result`` of every run in RUNS (tests/e2e/vllm_runner.py)."""
    tmp = tmp_path_factory.mktemp("dflash-gpu")
    target = tmp / "tiny-h256.gguf"
    make_tiny_gguf(target, fmt="pq2_0", seed=7, config=TARGET)
    from vllm_prism.spec_decode.tiny_drafter import make_tiny_drafter

    # A rotary table shorter than the requests (prompt + 24 tokens + k drafts): without patch
    # dflash_draft_positions every DFlash engine dies on a device-side assert in its gather.
    drafter = make_tiny_drafter(tmp / "drafter", target, max_positions=16)["path"]
    request = {"prompts": PROMPTS, "max_tokens": NEW_TOKENS, "score": []}
    reqs = [dflash_requests(drafter, request, llm=_llm(kv), ks=(k,) if k else (),
                            plain=not k, drafter_quantization=quant,
                            record_cudagraphs=True)[k] for kv, k, quant in RUNS]
    with pytest.MonkeyPatch.context() as mp:  # the engines' environment: the default
        mp.delenv("VLLM_PRISM_DRAFT_ATTENTION", raising=False)
        done = dict(zip(RUNS, run_vllm_all(target, reqs, tmp)))

    def result(kv: str, k: int, quant: str | None = None) -> dict:
        if kv not in SELECTED or (k and k not in KS):
            pytest.skip(f"PRISM_DFLASH_KV={','.join(SELECTED)} PRISM_DFLASH_K={KS}")
        return done[kv, k, quant if k else None]

    return result


@pytest.mark.parametrize("kv", list(KV))
@pytest.mark.parametrize("k", [3, 7])
def test_greedy_with_dflash_equals_greedy_without(runs: dict, kv: str, k: int) -> None:
    assert runs(kv, k)["greedy"] == runs(kv, 0)["greedy"]


def test_fp8_drafter_greedy_equals_greedy_without(runs: dict) -> None:
    """The drafter quantized online to fp8 (the quantized-drafter path: its context K/V run
    through each layer's own quant method); greedy output still equals the plain run's, and
    its drafts are still accepted."""
    res = runs("bf16", 3, "fp8")
    assert res["greedy"] == runs("bf16", 0)["greedy"]
    stats = res["spec_decode"]
    assert stats["num_accepted_tokens_per_pos"][0] / stats["num_drafts"] > 0.5


@pytest.mark.parametrize("kv", list(KV))
@pytest.mark.parametrize("k", [3, 7])
def test_drafter_accepted_and_verify_runs_in_full_graphs(runs: dict, kv: str, k: int) -> None:
    res = runs(kv, k)
    stats = res["spec_decode"]
    drafts = stats["num_drafts"]
    first = stats["num_accepted_tokens_per_pos"][0] / drafts
    steps = res["cudagraphs"]
    verify = [s for s in steps if step_record.is_uniform(s, k + 1)]
    full = [s for s in verify if s[2] == "FULL"]
    print(f"{kv} k={k}: {drafts} drafts, first-position acceptance {first:.2f}, mean accepted "
          f"{stats['num_accepted_tokens'] / drafts:.2f}; {len(steps)} steps, {len(verify)} "
          f"uniform verify steps, {len(full)} as FULL graphs; modes "
          f"{sorted({s[2] for s in steps})}")
    print("\n".join(res["prism_log"]))
    assert first > 0.5  # chance: 1 / 512
    assert verify and len(full) == len(verify), steps
    if kv == "int8":
        # the drafter's non-causal blocks on the PRISM backend's split path, not on vLLM's
        # Triton attention (which vLLM selects for an INT8 draft on its own)
        assert any("non-causal draft blocks run the split-KV path" in x
                   for x in res["prism_log"]), res["prism_log"]
        # the verification kernel's form that VLLM_PRISM_ATTN_VERIFY_FORM=auto served, said
        # once by the engine: the TMA form where the GPU has it (head size 256), on vLLM's
        # hybrid cache pool (a layout its tensor map could not cover would fall back to mma
        # and name why)
        served = [x for x in res["prism_log"] if "verification attention runs the" in x]
        line = "vllm-prism: the INT8 verification attention runs the "
        assert TARGET.head_dim in cuda_decode.WGMMA_HEAD_SIZES
        if (torch.cuda.get_device_capability() == (9, 0)
                and has_compiled_op(cuda_decode.WGMMA_VERIFY_OP)):
            assert served == [line + "wgmma_tma form (VLLM_PRISM_ATTN_VERIFY_FORM=auto)"], \
                res["prism_log"]
        else:
            assert len(served) == 1 and served[0].startswith(
                line + "mma form (VLLM_PRISM_ATTN_VERIFY_FORM=auto: "), res["prism_log"]
