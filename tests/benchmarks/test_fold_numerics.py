"""benchmarks/quality/fold_numerics.py on a small case: its fold rule is the GPU tests' reference
rule (tests/kernels/pq2_reference.py), its paths rank as their roundings say, and it writes its
record."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "quality"))
sys.path.insert(0, str(ROOT / "tests" / "kernels"))

import fold_numerics as fn  # noqa: E402
from pq2_reference import fold_scales  # noqa: E402


@pytest.mark.parametrize("levels", [63, 127])
def test_fold_rule_is_the_kernel_tests_rule(levels: int) -> None:
    d = fn.group_scales("wide", 16, 40, torch.Generator().manual_seed(levels))
    got = fn.fold_scales(d, levels)
    want = fold_scales(d.to(torch.float16), levels=levels)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
    step = d.reshape(16, 5, 8).abs().amax(2, keepdim=True) / levels  # D of each block
    q = (got.reshape(16, 5, 8) / step).reshape(16, 40)
    assert torch.allclose(q, q.round(), atol=1e-6) and q.abs().max() <= levels + 1e-6


@pytest.mark.parametrize("scales", fn.SCENARIOS)
def test_paths_rank_by_their_roundings(scales: str) -> None:
    e = fn.case(scales, 64, 16, 2048, 1)
    assert e["gemm_dq"] < e["int8/128"] < e["fold 127"] < e["fold 63"]
    # twice the levels, about half the scales' error
    assert 0.35 < e["fold 127, weights only"] / e["fold 63, weights only"] < 0.65
    assert e["int8/128"] < e["int8/1024, activation only"] < e["fold 127"]


def test_writes_its_record(tmp_path: Path) -> None:
    assert fn.main(["--rows", "32", "--tokens", "8", "--k", "1024", "--out", str(tmp_path)]) == 0
    rec = json.loads((tmp_path / "fold_numerics_cpu.json").read_text())
    assert [r["scales"] for r in rec["results"]] == list(fn.SCENARIOS)
    md = (tmp_path / "fold_numerics_cpu.md").read_text()
    assert md.count("\n| ") == 1 + len(fn.SCENARIOS)
    with pytest.raises(SystemExit):
        fn.main(["--k", "1000"])
