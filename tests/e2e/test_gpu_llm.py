"""The tiny Bonsai model in vLLM on a CUDA GPU, in every compilation mode vLLM serves in,
against transformers' Qwen3.5 on the un-folded weights (tests/e2e/oracle.py).

Modes: eager (``enforce_eager``), vLLM's default (torch.compile with piecewise CUDA graphs and
full graphs for uniform decode batches: FULL_AND_PIECEWISE), and piecewise graphs alone; each
with the BF16 and the ``int8_per_token_head`` KV cache; one request at a time and 16 at once.
Token ids must equal the reference's greedy continuation and teacher-forced log-probabilities
stay within LOGPROB_ATOL (test_llm.py explains the tolerance; the INT8 cache adds its
quantisation error, measured in docs/attention.md). Graph replay must give eager's tokens.
A 640-token sequence is scored as well: its prefill is one chunk of a step of M >= 640 tokens
(the short sequences scored beside it), so every linear, the LM head of its prompt
log-probabilities included, runs the prefill kernel (from M = 512
``gemm_dq``; with ``VLLM_PRISM_PQ2_FOLD_PREFILL=1`` ``wgmma_fold`` on compute capability 9.0
with vllm_prism._C's op, the tiny model's codes being ternary: on the H200 on 2026-12-05 it
moved these log-probs 0.35-0.40 nats from transformers' at most, against gemm_dq's 0.17-0.19,
and failed), checked position by position against transformers (the CPU build, with the torch
kernels, differs from it by at most 0.14 nats there). Its first 480 tokens are scored again in
a step of their own (M = 480: the int8 tensor-core prefill the automatic choice gives chunks
of 128-511 tokens).

The configurations start in parallel subprocesses (one engine each, a slice of the GPU's
memory), so the first compile of each runs side by side.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from . import oracle
from .test_llm import LOGPROB_ATOL, NEW_TOKENS, PROMPTS, RUNNER

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

MODES = {
    "eager": {"enforce_eager": True},
    "default": {},  # vLLM's default: compile + FULL_AND_PIECEWISE graphs
    "piecewise": {"compilation_config": {"cudagraph_mode": "PIECEWISE"}},
}
KV = {"bf16": "auto", "int8": "int8_per_token_head"}
CONFIGS = [(m, kv) for m in MODES for kv in KV]
MEMORY_SHARE = 0.08
# A fixed KV-cache size: engines starting side by side would otherwise count each other's
# memory as their own during vLLM's memory profiling and find no room for the cache.
KV_CACHE_BYTES = 1 << 30
# 16 concurrent requests: the 4 prompts with 4 different prefixes each.
BATCH_PREFIXES = ["", "Note: ", "Q: ", "Hello. "]
# A small batch on its own: its decode steps have M = SMALL_BATCH (the small-batch kernel).
SMALL_BATCH = 4
# The long scored sequence: past dispatch.GEMM_DQ_AUTO_MIN_M tokens, in one prefill chunk.
LONG_TOKENS = 640
# Its first MID_TOKENS scored in a step of their own: M = 480 on every linear, the automatic
# choice's range below gemm_dq (mma_cuda with vllm_prism._C: int8 activations per 128-group).
MID_TOKENS = 480
# The engine log's kernel choices (vllm_prism.kernels.pq2.dispatch logs each once), the
# automatic ones ("K=512 bfloat16: kernel ...") and those VLLM_PRISM_PQ2_KERNEL names
# ("K=512: kernel ... (VLLM_PRISM_PQ2_KERNEL)").
KERNEL_LOG = re.compile(r"PQ2 linear \S+ M=\d+ N=\d+ K=\d+(?: \S+)?: kernel (\w+)")


def _llm_kwargs(mode: str, kv: str) -> dict:
    return {"enforce_eager": False, "enable_prefix_caching": False, "max_model_len": 1024,
            "gpu_memory_utilization": MEMORY_SHARE, "kv_cache_memory_bytes": KV_CACHE_BYTES,
            "kv_cache_dtype": KV[kv], "max_num_seqs": 16,
            **MODES[mode]}


@pytest.fixture(scope="module")
def reference(tiny_gguf) -> dict:
    model_path = tiny_gguf("pq2_0", seed=7)
    tok = oracle.load_reference_tokenizer(model_path)
    model = oracle.load_reference_model(model_path)
    texts = [p + t for p in BATCH_PREFIXES for t in PROMPTS]
    prompts = [tok.encode(t) for t in texts]
    greedy = [oracle.greedy(model, p, NEW_TOKENS)[-NEW_TOKENS:] for p in prompts]
    full = [p + g for p, g in zip(prompts, greedy)]
    long = tok.encode(" ".join(PROMPTS * 60))[:LONG_TOKENS]
    assert len(long) == LONG_TOKENS
    scores = []
    for ids in [*full[:len(PROMPTS)], long]:
        lp = oracle.teacher_forced_logprobs(model, ids)
        scores.append([lp[t - 1, ids[t]].item() for t in range(1, len(ids))])
    return {"model": model_path, "prompts": prompts, "greedy": greedy, "full": full,
            "long": long, "score": scores}


@pytest.fixture(scope="module")
def results(reference: dict, tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("gpu-runs")
    procs = {}
    for mode, kv in CONFIGS:
        req = tmp / f"{mode}-{kv}.json"
        # The 16 prompts go in one generate() call: the scheduler batches them.
        req.write_text(json.dumps({"prompts": reference["prompts"], "max_tokens": NEW_TOKENS,
                                   "score": [*reference["full"][:len(PROMPTS)],
                                             reference["long"]],
                                   "score_alone": [reference["long"][:MID_TOKENS]],
                                   "single": reference["prompts"][0],
                                   "few": reference["prompts"][:SMALL_BATCH],
                                   "llm": _llm_kwargs(mode, kv)}))
        log = open(tmp / f"{mode}-{kv}.log", "w")
        procs[mode, kv] = (subprocess.Popen(
            [sys.executable, str(RUNNER), str(reference["model"]), str(req)],
            stdout=subprocess.PIPE, stderr=log, text=True,
            env={**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}), tmp / f"{mode}-{kv}.log")
    out = {}
    for key, (proc, log) in procs.items():
        stdout, _ = proc.communicate(timeout=1200)
        lines = [x for x in stdout.splitlines() if x.startswith("RESULT ")]
        text = Path(log).read_text()
        out[key] = (json.loads(lines[0][len("RESULT "):]) if proc.returncode == 0 and lines
                    else {"error": text[-4000:]})
        # vLLM's log (ours included) goes to stdout unless VLLM_LOGGING_STREAM says otherwise
        out[key]["kernels"] = sorted(set(KERNEL_LOG.findall(stdout + text)))
    return out


def _result(results: dict, mode: str, kv: str) -> dict:
    res = results[mode, kv]
    assert "error" not in res, res.get("error")
    return res


@pytest.mark.parametrize("mode,kv", CONFIGS)
def test_tokens_match_transformers(results: dict, reference: dict, mode: str, kv: str) -> None:
    res = _result(results, mode, kv)
    assert res["greedy"] == reference["greedy"]  # 16 requests at once
    assert res["single"] == reference["greedy"][0]  # one request alone (batch 1)
    assert res["few"] == reference["greedy"][:SMALL_BATCH]  # a small batch on its own


@pytest.mark.parametrize("mode,kv", CONFIGS)
def test_logprobs_match_transformers(results: dict, reference: dict, mode: str,
                                     kv: str) -> None:
    res = _result(results, mode, kv)
    n = len(PROMPTS)
    got = torch.tensor([x for row in res["score"][:n] for x in row])
    want = torch.tensor([x for row in reference["score"][:n] for x in row])
    err = (got - want).abs()
    print(f"{mode}/{kv}: max |dlogprob| {err.max():.4f}, mean {err.mean():.4f}")
    assert err.max() <= LOGPROB_ATOL


@pytest.mark.parametrize("mode,kv", CONFIGS)
def test_long_prefill_logprobs_match_transformers(results: dict, reference: dict, mode: str,
                                                  kv: str) -> None:
    """The 640-token sequence's log-probabilities at every position, from one M = 640 prefill
    chunk on the prefill kernel, which the engine log must name."""
    res = _result(results, mode, kv)
    _check_scored(f"{mode}/{kv} long", res["score"][-1], reference["score"][-1], LONG_TOKENS,
                  res["kernels"])
    assert _prefill_kernel() in res["kernels"]


@pytest.mark.parametrize("mode,kv", CONFIGS)
def test_mid_prefill_logprobs_match_transformers(results: dict, reference: dict, mode: str,
                                                 kv: str) -> None:
    """The long sequence's first MID_TOKENS alone in their step (M = 480, below gemm_dq's
    range: the int8 tensor-core prefill) at every position; transformers' log-probs of a
    prefix are the long sequence's first ones (causal attention)."""
    res = _result(results, mode, kv)
    _check_scored(f"{mode}/{kv} mid", res["score_alone"][0],
                  reference["score"][-1][:MID_TOKENS - 1], MID_TOKENS, res["kernels"])


def _check_scored(label: str, got: list[float], want: list[float], tokens: int,
                  kernels: list[str]) -> None:
    """A scored sequence of ``tokens`` against transformers' log-probs, position by position."""
    got_t, want_t = torch.tensor(got), torch.tensor(want)
    assert got_t.shape == want_t.shape == (tokens - 1,)
    err = (got_t - want_t).abs()
    print(f"{label}: max |dlogprob| {err.max():.4f}, mean {err.mean():.4f}, kernels {kernels}")
    assert err.max() <= LOGPROB_ATOL


def _prefill_kernel() -> str:
    """The kernel the automatic choice gives a prefill of M >= 512 on this GPU (ternary
    codes, every linear of the tiny model within gemm_dq's matrix bound) under this process's
    VLLM_PRISM_PQ2_FOLD_PREFILL, which the engines inherit."""
    from vllm_prism import envs
    from vllm_prism.kernels.pq2.dispatch import WgmmaFoldKernel

    ok, _ = WgmmaFoldKernel.is_supported(torch.cuda.get_device_capability())
    return "wgmma_fold" if ok and envs.VLLM_PRISM_PQ2_FOLD_PREFILL else "gemm_dq"


def test_small_batches_run_the_small_batch_kernel(results: dict) -> None:
    """With vllm_prism._C built, the engine chooses the CUDA C++ GEMV (``gemv_cuda``) for
    M = 1 (and M = 2 where K is not a multiple of 512), ``mma_lean_cuda`` for M = 2..8 where
    K is (the down projection's K = 512) and ``mma_small_cuda`` for M = 3..8 where it is not
    (K = 256: the small batch's decode steps; vLLM's graph capture runs such sizes too), and
    ``mma_cuda`` above (the 16 requests' decode), as its log says."""
    from vllm_prism._custom_ops import has_compiled_op

    if not has_compiled_op("pq2_mma_small_int8"):
        pytest.skip("vllm_prism._C with pq2_mma_small_int8 is not built")
    kernels = _result(results, "default", "bf16")["kernels"]
    assert {"gemv_cuda", "mma_lean_cuda", "mma_small_cuda", "mma_cuda"} <= set(kernels), \
        kernels


def test_named_kernels_run(results: dict) -> None:
    """A run with ``VLLM_PRISM_PQ2_KERNEL`` naming kernels (an opt-in kernel checked against
    transformers by the tests above) really ran each named kernel: the engine's log says so."""
    from vllm_prism.kernels.pq2 import dispatch

    named = dispatch._forced_names(os.environ.get("VLLM_PRISM_PQ2_KERNEL", "").lower())
    if not named:
        pytest.skip("VLLM_PRISM_PQ2_KERNEL names no kernel")
    kernels = _result(results, "default", "bf16")["kernels"]
    assert set(named) <= set(kernels), (named, kernels)


@pytest.mark.parametrize("kv", list(KV))
@pytest.mark.parametrize("mode", ["default", "piecewise"])
def test_graph_replay_equals_eager(results: dict, mode: str, kv: str) -> None:
    assert _result(results, mode, kv)["greedy"] == _result(results, "eager", kv)["greedy"]
