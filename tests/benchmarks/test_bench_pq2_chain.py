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

    run_cpu_smoke("bench_pq2_chain.py", tmp_path, "--engine-like", "--m", "6", "--parts", "all",
                  "weights", "producers", timeout=600)
    res = json.loads((tmp_path / "pq2_chain_cpu-smoke_m6_engine.json").read_text())
    assert res["engine_like"] is True and res["m"] == 6
    # int8 activations against the fp32 reference: ~1e-2 at most; a wrong prologue, sign or
    # width would be off by O(1)
    assert 0.0 < res["check_rel_err"] < 0.03, res["check_rel_err"]
    assert [(r["gap_us"], r["part"]) for r in res["records"]] == [
        (0.0, "all"), (0.0, "weights"), (0.0, "producers")]
    assert all(r["us_per_layer"] > 0 for r in res["records"])
    # a share of the bandwidth only for the parts that read the weights
    assert [r["bw_frac"] is None for r in res["records"]] == [False, False, True]
    table = (tmp_path / "pq2_chain_cpu-smoke_m6_engine.md").read_text()
    assert "signs and prologues as in the engine" in table
    assert table.rstrip().endswith("| producers | " + str(res["records"][2]["us_per_layer"])
                                   + " | - |")


def test_chain_parts_split_each_linear_into_its_producer_and_weight_kernel(monkeypatch) -> None:
    """``--parts``: ``weights`` runs only the weight kernels on activations made before
    (once a linear), ``producers`` only the producers, ``all`` both for every linear."""
    import sys
    from pathlib import Path

    import torch

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "benchmarks"
                                    / "kernels"))
    sys.modules.pop("bench_pq2_chain", None)
    import bench_pq2_chain as chain

    log = []

    class Kernel:
        name = "k"

        @staticmethod
        def make_activation(x, w, pro):
            log.append(("produce", w))
            return ("act", w)

        @staticmethod
        def run(act, w, bias, dtype):
            log.append(("run", w, act))

    monkeypatch.setattr(chain, "select_kernel", lambda m, w, dtype, pro: Kernel)
    monkeypatch.setattr(chain, "pq2_linear_fused", lambda x, w, b, pro: log.append(("all", w)))
    layers = [["a0", "b0"], ["a1", "b1"]]
    xs = {4: torch.zeros(1, 4), 8: torch.zeros(1, 8)}
    pros = [(None, 4), (None, 8)]
    for part, made, ran in [("all", [], [("all", "a0"), ("all", "b0"), ("all", "a1"),
                                         ("all", "b1")]),
                            ("producers", [], [("produce", w) for w in ("a0", "b0", "a1", "b1")]),
                            ("weights", [("produce", "a0"), ("produce", "b0")],
                             [("run", "a0", ("act", "a0")), ("run", "b0", ("act", "b0")),
                              ("run", "a1", ("act", "a0")), ("run", "b1", ("act", "b0"))])]:
        log.clear()
        calls = chain.chain_calls(layers, xs, pros, part)
        assert log == made, part
        log.clear()
        for layer in calls:
            for call in layer:
                call()
        assert log == ran, part
    with pytest.raises(ValueError, match="one of all, weights, producers"):
        chain.chain_calls(layers, xs, pros, "kernels")
