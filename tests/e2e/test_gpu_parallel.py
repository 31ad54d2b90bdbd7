"""Tensor and pipeline parallelism on two GPUs, in vLLM's default mode (torch.compile and CUDA
graphs, NCCL), BF16 and INT8 KV: the tiny-tp model (see test_parallel_cpu.py) at TP=2 and
PP=2 gives TP=1's greedy tokens and log-probabilities within LOGPROB_ATOL of transformers'
Qwen3.5 on the un-folded weights. Skipped where fewer than two GPUs exist."""

from __future__ import annotations

import pytest
import torch

from .test_llm import LOGPROB_ATOL, NEW_TOKENS, run_vllm_all
from .test_parallel_cpu import model, reference  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.gpu, pytest.mark.slow,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")]

KV = {"bf16": "auto", "int8": "int8_per_token_head"}
LAYOUTS = {"tp1": {}, "tp2": {"tensor_parallel_size": 2}, "pp2": {"pipeline_parallel_size": 2}}
# The six engines run side by side (one after another they outlived a 560 s slot on two
# H200s), each with this share of every GPU it uses: at most all six on GPU 0.
MEMORY_SHARE = 0.12


def _llm(kv: str, layout: str) -> dict:
    return {"enforce_eager": False, "enable_prefix_caching": False, "max_model_len": 512,
            "gpu_memory_utilization": MEMORY_SHARE, "kv_cache_memory_bytes": 1 << 30,
            "kv_cache_dtype": KV[kv], **LAYOUTS[layout]}


@pytest.fixture(scope="module")
def results(model, reference: dict, tmp_path_factory: pytest.TempPathFactory) -> dict:  # noqa: F811
    tmp = tmp_path_factory.mktemp("gpu-parallel")
    runs = [(kv, layout) for kv in KV for layout in LAYOUTS]
    request = {"prompts": reference["prompts"], "max_tokens": NEW_TOKENS,
               "score": reference["full"]}
    return dict(zip(runs, run_vllm_all(model, [{**request, "llm": _llm(kv, layout)}
                                               for kv, layout in runs], tmp)))


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("kv", list(KV))
def test_parallel_matches_transformers_and_one_gpu(
        kv: str, layout: str, reference: dict, results: dict) -> None:  # noqa: F811 (a fixture)
    res = results[kv, layout]
    assert res["greedy"] == reference["greedy"] == results[kv, "tp1"]["greedy"]
    got = torch.tensor([x for row in res["score"] for x in row])
    want = torch.tensor([x for row in reference["score"] for x in row])
    err = (got - want).abs()
    print(f"{kv}/{layout}: max |dlogprob| {err.max():.4f}, mean {err.mean():.4f}")
    assert err.max() <= LOGPROB_ATOL
