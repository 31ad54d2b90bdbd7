"""LLM() with the plugin against transformers' Qwen3.5 on the un-folded weights.

The oracle (tests/e2e/oracle.py) un-folds the tiny GGUF to primal weights and runs
transformers' own Qwen3.5 text model in float32: an implementation we did not write.
vLLM must give the same greedy continuations and teacher-forced log-probabilities within
LOGPROB_ATOL. The tolerance: vLLM runs in bf16 (its CPU Gated DeltaNet kernel runs only in
bf16), and bf16 moves this 4-layer model's log-probabilities by up to ~0.15 nats (measured
with transformers itself in bf16), while leaving out the Hadamard rotation moves them by
2-6 nats and scaling a single down_proj by 0.9 by 0.1-0.3; 0.35 sits between bf16 noise
and real bugs. Greedy tokens alone cannot tell those apart (the tiny model's successor
structure dominates the argmax), hence the log-probability check.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from . import oracle

pytestmark = pytest.mark.slow

PROMPTS = ["Hello, world!", "The capital of France is", "Two plus two is four.",
           "Serving a model well means"]
NEW_TOKENS = 12
LOGPROB_ATOL = 0.35
RUNNER = Path(__file__).with_name("vllm_runner.py")


RUN_TIMEOUT_S = int(os.environ.get("PRISM_TEST_RUN_TIMEOUT", "900"))


def _run_logs(tmp: Path) -> Path:
    """Where each engine run's stdout/stderr go: ``$PRISM_TEST_LOG_DIR`` if set (so a run cut
    off from outside, e.g. by a device call's time limit, leaves its log there), else tmp."""
    where = Path(os.environ.get("PRISM_TEST_LOG_DIR") or tmp)
    where.mkdir(parents=True, exist_ok=True)
    return where


def run_vllm(model: Path, request: dict, tmp: Path) -> dict:
    """One engine run of tests/e2e/vllm_runner.py in its own process; its RESULT record plus
    the engine's kernel and attention-route log lines. A run that outlives
    ``PRISM_TEST_RUN_TIMEOUT`` seconds is killed and fails with the tail of its log."""
    return run_vllm_all(model, [request], tmp)[0]


def run_vllm_all(model: Path, requests: list[dict], tmp: Path) -> list[dict]:
    """Like run_vllm, for several requests whose engines run side by side (one process each,
    all started before the first is waited for: on a GPU their compiles overlap; give each
    engine its slice of the GPU's memory in its ``llm`` arguments)."""
    started = [_start_run(model, r, tmp) for r in requests]
    try:
        return [_finish_run(*run) for run in started]
    finally:  # one failed: stop the others
        for proc, *_ in started:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _start_run(model: Path, request: dict, tmp: Path) -> tuple:
    logs = _run_logs(tmp)
    n = len(list(logs.glob("run-*.err")))
    req = tmp / f"{model.stem}-request-{n:02d}.json"
    req.write_text(json.dumps(request))
    out_path, err_path = logs / f"run-{n:02d}.out", logs / f"run-{n:02d}.err"
    err_path.write_text(f"# {model} {json.dumps(request)}\n")
    with open(out_path, "w") as out_f, open(err_path, "a") as err_f:
        proc = subprocess.Popen([sys.executable, str(RUNNER), str(model), str(req)],
                                stdout=out_f, stderr=err_f, text=True)
    return proc, out_path, err_path, time.monotonic() + RUN_TIMEOUT_S


def _finish_run(proc: subprocess.Popen, out_path: Path, err_path: Path,
                deadline: float) -> dict:
    try:
        rc = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        pytest.fail(f"engine run timed out after {RUN_TIMEOUT_S} s; its log ends:\n"
                    + err_path.read_text()[-4000:])
    stdout, stderr = out_path.read_text(), err_path.read_text()
    assert rc == 0, stderr[-4000:]
    # A clean start: no ERROR line (vLLM probing the tokenizer folder for a model config
    # logged two and slept through a retry).
    assert not [x for x in stderr.splitlines() if " ERROR " in x], stderr[-4000:]
    line = next(x for x in stdout.splitlines() if x.startswith("RESULT "))
    out = json.loads(line[len("RESULT "):])
    # What the engine said about its kernel and attention-path choices (the message only:
    # process ids and times differ between runs): the PQ2 kernels, the attention routes, the
    # INT8 verification kernel's served form.
    out["prism_log"] = [x.split("] ", 1)[-1] for x in (stdout + stderr).splitlines()
                        if "PQ2 linear" in x or "PRISM attention" in x
                        or "verification attention runs the" in x]
    return out


@pytest.fixture(scope="module")
def models(tiny_gguf) -> dict[str, Path]:
    return {fmt: tiny_gguf(fmt, seed=7) for fmt in ("pq2_0", "ptq1_0", "q2_0")}


@pytest.fixture(scope="module")
def reference(models: dict[str, Path]) -> dict:
    """Oracle prompts, greedy continuations and teacher-forced log-probs per format."""
    tok = oracle.load_reference_tokenizer(models["pq2_0"])
    prompts = [tok.encode(p) for p in PROMPTS]
    out = {}
    for fmt in ("pq2_0", "q2_0"):
        out[fmt] = oracle.reference_run(oracle.load_reference_model(models[fmt]), prompts,
                                        NEW_TOKENS)
    return out


@pytest.fixture(scope="module")
def vllm_results(models: dict[str, Path], reference: dict,
                 tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("runs")
    out = {}
    for fmt in ("pq2_0", "ptq1_0", "q2_0"):
        ref = reference["q2_0" if fmt == "q2_0" else "pq2_0"]
        out[fmt] = run_vllm(models[fmt], {"prompts": ref["prompts"], "max_tokens": NEW_TOKENS,
                                          "score": ref["full"],
                                          "score_alone": ref["full"][:1]}, tmp)
    return out


@pytest.mark.parametrize("fmt", ["pq2_0", "q2_0"])
def test_greedy_matches_transformers(fmt: str, reference: dict, vllm_results: dict) -> None:
    assert vllm_results[fmt]["greedy"] == reference[fmt]["greedy"]


@pytest.mark.parametrize("fmt", ["pq2_0", "q2_0"])
def test_logprobs_match_transformers(fmt: str, reference: dict, vllm_results: dict) -> None:
    got = torch.tensor([x for row in vllm_results[fmt]["score"] for x in row])
    want = torch.tensor([x for row in reference[fmt]["score"] for x in row])
    assert got.shape == want.shape
    err = (got - want).abs()
    print(f"{fmt}: max |dlogprob| {err.max():.4f}, mean {err.mean():.4f} over {len(err)}")
    assert err.max() <= LOGPROB_ATOL


@pytest.mark.parametrize("fmt", ["pq2_0", "q2_0"])
def test_a_sequence_scored_alone_matches_transformers(fmt: str, reference: dict,
                                                      vllm_results: dict) -> None:
    """The runner's "score_alone": the first sequence scored in a step of its own."""
    got = torch.tensor(vllm_results[fmt]["score_alone"][0])
    want = torch.tensor(reference[fmt]["score"][0])
    assert got.shape == want.shape
    assert (got - want).abs().max() <= LOGPROB_ATOL


def test_ptq1_gives_exactly_pq2_outputs(vllm_results: dict) -> None:
    assert vllm_results["ptq1_0"] == vllm_results["pq2_0"]


def test_gdn_input_norm_runs_in_the_producer(vllm_results: dict) -> None:
    """The outputs above came through the fused Gated DeltaNet input path (the residual add and
    norm in in_proj_qkvz's producer, in_proj_ba on the input it returns): the op logs it."""
    for fmt in ("pq2_0", "q2_0"):
        assert any("the input norm runs in the producer" in x
                   for x in vllm_results[fmt]["prism_log"]), vllm_results[fmt]["prism_log"]
