"""benchmarks/kernels/bench_gdn_verify.py runs end to end under the Triton CPU interpreter
(``--cpu-smoke``: tiny heads, each launch configuration of the smoke list once): every
configuration of our kernel reproduces vLLM's Triton kernel's outputs from the same starting
states (the benchmark restores the states its reference call changed), and the results
files name every kernel it timed."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("vllm")
pytest.importorskip("triton")


def test_cpu_smoke_run_matches_vllms_kernel(tmp_path) -> None:
    from conftest import run_cpu_smoke

    run_cpu_smoke("bench_gdn_verify.py", tmp_path, timeout=600)
    res = json.loads((tmp_path / "gdn_verify_cpu-smoke.json").read_text())
    kernels = [r["kernel"] for r in res["records"]]
    assert kernels[:2] == ["vllm_triton_kernel", "vllm_triton_path"], kernels
    prism = [r for r in res["records"] if r["kernel"].startswith("prism ")]
    assert len(prism) >= 2 and all(r["err"] == 0.0 for r in prism), prism
    assert all(r["us"] > 0 for r in res["records"])
    table = (tmp_path / "gdn_verify_cpu-smoke.md").read_text()
    assert all(f"| {k} |" in table for k in kernels)
