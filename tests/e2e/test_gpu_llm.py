"""The tiny Bonsai model in vLLM on a CUDA GPU, in every compilation mode vLLM serves in,
against transformers' Qwen3.5 on the un-folded weights (tests/e2e/oracle.py).

Modes: eager (``enforce_eager``), vLLM's default (torch.compile with piecewise CUDA graphs and
full graphs for uniform decode batches: FULL_AND_PIECEWISE), and piecewise graphs alone; each
with the BF16 and the ``int8_per_token_head`` KV cache; one request at a time and 16 at once.
Token ids must equal the reference's greedy continuation and teacher-forced log-probabilities
stay within LOGPROB_ATOL (test_llm.py explains the tolerance; the INT8 cache adds its
quantisation error, measured in docs/attention.md). Graph replay must give eager's tokens.

The configurations start in parallel subprocesses (one engine each, a slice of the GPU's
memory), so the first compile of each runs side by side.
"""

from __future__ import annotations

import json
import os
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


def _llm_kwargs(mode: str, kv: str) -> dict:
    return {"enforce_eager": False, "enable_prefix_caching": False, "max_model_len": 512,
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
    scores = []
    for ids in full[:len(PROMPTS)]:
        lp = oracle.teacher_forced_logprobs(model, ids)
        scores.append([lp[t - 1, ids[t]].item() for t in range(1, len(ids))])
    return {"model": model_path, "prompts": prompts, "greedy": greedy, "full": full,
            "score": scores}


@pytest.fixture(scope="module")
def results(reference: dict, tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("gpu-runs")
    procs = {}
    for mode, kv in CONFIGS:
        req = tmp / f"{mode}-{kv}.json"
        # The 16 prompts go in one generate() call: the scheduler batches them.
        req.write_text(json.dumps({"prompts": reference["prompts"], "max_tokens": NEW_TOKENS,
                                   "score": reference["full"][:len(PROMPTS)],
                                   "single": reference["prompts"][0],
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
        out[key] = (json.loads(lines[0][len("RESULT "):]) if proc.returncode == 0 and lines
                    else {"error": Path(log).read_text()[-4000:]})
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


@pytest.mark.parametrize("mode,kv", CONFIGS)
def test_logprobs_match_transformers(results: dict, reference: dict, mode: str,
                                     kv: str) -> None:
    res = _result(results, mode, kv)
    got = torch.tensor([x for row in res["score"] for x in row])
    want = torch.tensor([x for row in reference["score"] for x in row])
    err = (got - want).abs()
    print(f"{mode}/{kv}: max |dlogprob| {err.max():.4f}, mean {err.mean():.4f}")
    assert err.max() <= LOGPROB_ATOL


@pytest.mark.parametrize("kv", list(KV))
@pytest.mark.parametrize("mode", ["default", "piecewise"])
def test_graph_replay_equals_eager(results: dict, mode: str, kv: str) -> None:
    assert _result(results, mode, kv)["greedy"] == _result(results, "eager", kv)["greedy"]
