"""benchmarks/kernels/bench_pq2_chain.py runs end to end under the Triton CPU interpreter
(``--cpu-smoke``) with ``--engine-like``: every linear of a layer through the producer
prologue the Bonsai model gives it and folded Hadamard signs, each within int8 rounding of the
torch reference (dequantized weight, fp32 producer), and the results files say so."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("triton")


def test_cpu_smoke_engine_like_run_matches_the_reference(tmp_path) -> None:
    from conftest import run_cpu_smoke

    run_cpu_smoke("bench_pq2_chain.py", tmp_path, "--engine-like", "--m", "6", timeout=600)
    res = json.loads((tmp_path / "pq2_chain_cpu-smoke_m6_engine.json").read_text())
    assert res["engine_like"] is True and res["m"] == 6
    # int8 activations against the fp32 reference: ~1e-2 at most; a wrong prologue, sign or
    # width would be off by O(1)
    assert 0.0 < res["check_rel_err"] < 0.03, res["check_rel_err"]
    assert [r["gap_us"] for r in res["records"]] == [0.0]
    assert all(r["us_per_layer"] > 0 for r in res["records"])
    table = (tmp_path / "pq2_chain_cpu-smoke_m6_engine.md").read_text()
    assert "signs and prologues as in the engine" in table
