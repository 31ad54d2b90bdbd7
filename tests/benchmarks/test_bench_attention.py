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


def test_cuda_sweep_segments(monkeypatch) -> None:
    """The segmentation sweep's decode rows past two CTAs a multiprocessor get the segments they
    name (the library's cap of 256 would make 3 CTAs a multiprocessor on 132 SMs the same 256
    as 2), its verification rows one, two and four waves, and the markdown lists each row's
    segment count, the verification rows in a table of their own."""
    import sys
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "benchmarks"
                                    / "kernels"))
    sys.modules.pop("bench_attention", None)
    import bench_attention
    from vllm_prism.attention.ops import cuda_decode

    got = {}
    for ctas, _, _, most in bench_attention.CUDA_SWEEP:
        with bench_attention.cuda_settings(CTAS_PER_SM=ctas, MAX_SEGMENTS=most):
            got[(ctas, most)] = cuda_decode.num_cuda_segments(1, 132)
    assert got[(2, 256)] == 256 and got[(3, 256)] == 256  # 264 and 396, capped
    assert got[(4, 1024)] == 528 and got[(8, 1024)] == 1024  # 132 x 4; 1056 capped
    # verification: segments a KV head (4 of them), two a CTA
    verify = {}
    for per_sm in bench_attention.VERIFY_SWEEP:
        with bench_attention.cuda_settings(VERIFY_CTAS_PER_SM=per_sm):
            verify[per_sm] = cuda_decode.num_cuda_segments(1, 132, 4,
                                                           cuda_decode.VERIFY_CTAS_PER_SM)
    assert verify == {2: 66, 4: 132, 8: 256}  # 264 capped
    res = {"gpu": "test", "date": "2026-12-07", "command": "test", "read_gbps": 3000.0,
           "records": [], "sweep": [], "errors": [], "cuda_sweep": [
        dict(kind="decode", kernel="cuda", kv="int8", context=131072, ctas_per_sm=8,
             min_tiles=4, dim_split=2, segments=1024, us=90.0, bw_frac=0.9, err=1e-3),
        dict(kind="verify", kernel="cuda", kv="int8", context=32768, q_tokens=6, ctas_per_sm=4,
             segments=132, us=40.0, bw_frac=0.55, err=2e-3)]}
    table = bench_attention.markdown(res)
    assert "| 131072 | 8 | 1024 | 4 | 2 | 90.0 | 0.9 | 0.001 |" in table
    assert "| 32768 | 6 | 4 | 132 | 40.0 | 0.55 | 0.002 |" in table
    assert table.count("| 32768 |") == 1  # the verification row not in the decode table
