"""benchmarks/kernels/bench_gdn_verify.py runs end to end under the Triton CPU interpreter
(``--cpu-smoke``: tiny heads, each launch configuration of the smoke list once): every
configuration of our kernel reproduces vLLM's Triton kernel's outputs from the same starting
states (the benchmark restores the states its reference call changed), and the results
files name every kernel it timed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("vllm")
pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[2]


def test_cpu_smoke_run_matches_vllms_kernel(tmp_path) -> None:
    from conftest import run_python

    script = ROOT / "benchmarks" / "kernels" / "bench_gdn_verify.py"
    proc = run_python([str(script), "--cpu-smoke", "--out", str(tmp_path)], script.parent,
                      timeout=600, TRITON_INTERPRET="1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads((tmp_path / "gdn_verify_cpu-smoke.json").read_text())
    kernels = [r["kernel"] for r in res["records"]]
    assert kernels[:2] == ["vllm_triton_kernel", "vllm_triton_path"], kernels
    prism = [r for r in res["records"] if r["kernel"].startswith("prism ")]
    assert len(prism) >= 2 and all(r["err"] == 0.0 for r in prism), prism
    assert all(r["us"] > 0 for r in res["records"])
    table = (tmp_path / "gdn_verify_cpu-smoke.md").read_text()
    assert all(f"| {k} |" in table for k in kernels)
