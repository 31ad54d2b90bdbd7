"""benchmarks/quality/compare_kv_dtypes.py without an engine: the comparison of two scored
runs, and ``--pq2-kernel``'s runs each given their ``VLLM_PRISM_PQ2_KERNEL`` in the child's
environment (the children are faked; the GPU run scores the 27B-shaped file)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "quality"))

import compare_kv_dtypes as cq  # noqa: E402


def test_compare_of_two_runs() -> None:
    first = [(-1.0, 5), (-2.0, 6)]
    second = [(-1.5, 5), (-2.0, 7)]
    got = cq.compare(first, second, ("a", "b"))
    assert got["nll_a"] == pytest.approx(1.5) and got["nll_b"] == pytest.approx(1.75)
    assert got["delta_nll"] == pytest.approx(0.25)
    assert got["ppl_ratio"] == pytest.approx(math.exp(0.25))
    assert got["top1_agreement"] == 0.5
    # the absolute differences do not cancel where the means would
    assert cq.compare([(-1.0, 5), (-2.0, 6)], [(-2.0, 5), (-1.0, 6)], ("a", "b"))[
        "mean_abs_dlogprob"] == pytest.approx(1.0)


def test_pq2_kernel_runs_get_their_switch(monkeypatch, capsys) -> None:
    seen = []

    def fake_run(cmd, stdout, text, check, env):
        model, ids, kv, max_len, eager = json.loads(cmd[-1])
        seen.append((kv, env.get("VLLM_PRISM_PQ2_KERNEL")))
        lp = -1.0 if env.get("VLLM_PRISM_PQ2_KERNEL") == "auto" else -1.25
        rows = [[lp, 3] for _ in ids[1:]]
        return subprocess.CompletedProcess(cmd, 0, stdout="noise\nROWS " + json.dumps(rows))

    _run_main(monkeypatch, fake_run, 9, "--pq2-kernel", "auto", "gemm_fp8,auto", "--kv",
              "int8_per_token_head")
    assert seen == [("int8_per_token_head", "auto"), ("int8_per_token_head", "gemm_fp8,auto")]
    out = json.loads(capsys.readouterr().out)
    assert (out["a"], out["b"], out["tokens"]) == ("auto", "gemm_fp8,auto", 9)
    assert out["delta_nll"] == pytest.approx(0.25) and out["top1_agreement"] == 1.0


def test_several_pq2_kernels_against_the_first(monkeypatch, capsys) -> None:
    seen = []
    logprob = {"auto": -1.0, "mma_cuda,auto": -1.5, "wgmma_fold,auto": -3.0}

    def fake_run(cmd, stdout, text, check, env):
        k = env.get("VLLM_PRISM_PQ2_KERNEL")
        seen.append(k)
        ids = json.loads(cmd[-1])[1]
        rows = [[logprob[k], 3 if k != "wgmma_fold,auto" or i % 2 else 4]
                for i, _ in enumerate(ids[1:])]
        return subprocess.CompletedProcess(cmd, 0, stdout="ROWS " + json.dumps(rows))

    _run_main(monkeypatch, fake_run, 5, "--pq2-kernel", "auto", "mma_cuda,auto",
              "wgmma_fold,auto")
    assert seen == ["auto", "mma_cuda,auto", "wgmma_fold,auto"]
    got = json.loads(capsys.readouterr().out)["comparisons"]
    assert [(c["a"], c["b"]) for c in got] == [("auto", "mma_cuda,auto"),
                                               ("auto", "wgmma_fold,auto")]
    assert got[0]["delta_nll"] == pytest.approx(0.5) and got[0]["top1_agreement"] == 1.0
    assert got[1]["mean_abs_dlogprob"] == pytest.approx(2.0)
    assert got[1]["top1_agreement"] == 0.5


def test_one_pq2_kernel_is_refused(monkeypatch) -> None:
    monkeypatch.setattr(sys, "argv", ["x", "m.gguf", "--pq2-kernel", "auto"])
    with pytest.raises(SystemExit):
        cq.main()


def test_cache_dtype_runs_by_default(monkeypatch, capsys) -> None:
    seen = []

    def fake_run(cmd, stdout, text, check, env):
        seen.append((json.loads(cmd[-1])[2], env.get("VLLM_PRISM_PQ2_KERNEL")))
        return subprocess.CompletedProcess(cmd, 0, stdout="ROWS [[-2.0, 1]]")

    _run_main(monkeypatch, fake_run, 2)
    assert seen == [("auto", None), ("int8_per_token_head", None)]
    out = json.loads(capsys.readouterr().out)
    assert "nll_bf16" in out and "nll_int8" in out and out["delta_nll"] == 0.0


def _run_main(monkeypatch, fake_run, n_ids: int, *args: str) -> None:
    """compare_kv_dtypes.main on "m.gguf" with ``args``: the text tokenized as ids 0..n_ids-1,
    each child run answered by ``fake_run`` (no engine), VLLM_PRISM_PQ2_KERNEL unset here."""
    class Tok:
        def encode(self, text):
            return list(range(n_ids))

    monkeypatch.setattr(cq.subprocess, "run", fake_run)
    monkeypatch.setattr("transformers.AutoTokenizer.from_pretrained", lambda _: Tok())
    monkeypatch.setattr("vllm_prism.engine.arg_utils.materialize_tokenizer", lambda m: m)
    monkeypatch.delenv("VLLM_PRISM_PQ2_KERNEL", raising=False)
    monkeypatch.setattr(sys, "argv", ["x", "m.gguf", *args])
    cq.main()
