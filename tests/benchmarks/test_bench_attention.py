"""benchmarks/kernels/bench_attention.py runs end to end under the Triton CPU interpreter
(``--cpu-smoke``: tiny contexts, both cache dtypes): no measurement fails, every kind of row
is written (decode, verification, the non-causal draft block, the integer-Q.K decode,
prefill), the checked rows stay within the split path's error of the fp32 reference, and the
markdown table lists them. The CUDA C++ rows (``kernel`` cuda, ``verify_int_qk``) need a GPU
and are not written here."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("triton")


def test_cpu_smoke_run_writes_every_kind(tmp_path) -> None:
    from conftest import run_cpu_smoke

    run_cpu_smoke("bench_attention.py", tmp_path, timeout=900)
    res = json.loads((tmp_path / "attention_cpu-smoke.json").read_text())
    assert res["errors"] == [], res["errors"]
    kinds = {(r["kind"], r["kv"]) for r in res["records"]}
    for kv in ("int8", "bf16"):
        assert {("decode", kv), ("verify", kv), ("noncausal", kv), ("prefill", kv)} <= kinds
    assert ("decode_int_qk", "int8") in kinds
    assert not any(r.get("kernel") == "cuda" or r["kind"] == "verify_int_qk"
                   for r in res["records"])
    checked = [r for r in res["records"] if "err" in r]
    assert checked and all(r["err"] < 2e-2 for r in checked), checked
    assert all(r["us"] > 0 for r in res["records"])
    table = (tmp_path / "attention_cpu-smoke.md").read_text()
    assert table.count("| verify | triton |") == 4


def test_cuda_settings_are_restored(monkeypatch) -> None:
    """The benchmark's cuda_decode overrides hold inside the block and are restored after it,
    also when the timed call fails."""
    import sys
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "benchmarks"
                                    / "kernels"))
    sys.modules.pop("bench_attention", None)
    import bench_attention
    from vllm_prism.attention.ops import cuda_decode

    before = (cuda_decode.ATTN_PDL, cuda_decode.MIN_TILES)
    with pytest.raises(RuntimeError):
        with bench_attention.cuda_settings(ATTN_PDL=False, MIN_TILES=99):
            assert (cuda_decode.ATTN_PDL, cuda_decode.MIN_TILES) == (False, 99)
            raise RuntimeError("timed call failed")
    assert (cuda_decode.ATTN_PDL, cuda_decode.MIN_TILES) == before
