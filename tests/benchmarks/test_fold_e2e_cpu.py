"""benchmarks/quality/fold_e2e_cpu.py: its partial-block fold is the GPU tests' reference rule
(tests/kernels/pq2_reference.py) at the tiny model's widths, and a short run on the tiny model
writes every rule's row, with the emulation reaching the engine (the 63-level fold moves the
log-probs, the exact rule stays within the e2e tests' tolerance of transformers)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "quality"))
sys.path.insert(0, str(ROOT / "tests" / "kernels"))

import fold_e2e_cpu as fe  # noqa: E402
from pq2_reference import fold_scales  # noqa: E402


@pytest.mark.parametrize("groups", [2, 4, 12])
@pytest.mark.parametrize("levels", [63, 127])
def test_partial_block_fold_is_the_reference_rule(groups: int, levels: int) -> None:
    d = (torch.rand(8, groups, generator=torch.Generator().manual_seed(groups)) + 0.5).half()
    got = fe._fold(levels)(d)
    torch.testing.assert_close(got.double(), fold_scales(d, levels=levels), rtol=1e-6, atol=0)


def test_activation_rule_takes_the_row_where_it_is_narrower_than_a_block() -> None:
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(0))
    got = fe._act(fe.BLOCK)(x)
    step = x.abs().amax(-1, keepdim=True) / 127
    assert torch.allclose(got / step, (got / step).round(), atol=1e-4)
    assert (got - x).abs().max() <= step.max() / 2 + 1e-6


@pytest.mark.slow
def test_short_run_writes_every_rule(tmp_path: Path) -> None:
    """In a subprocess: the script starts its engine in its own process."""
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "quality" /
                                               "fold_e2e_cpu.py"),
                           "--tokens", "96", "--out", str(tmp_path)], timeout=900, cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {r["rule"]: r for r in json.loads((tmp_path / "fold_e2e_cpu_s7.json").read_text())
            ["rows"]}
    assert set(rows) == {*fe.RULES, fe.GEMM_DQ}
    assert rows["exact"]["max"] <= 0.35
    assert rows["fold63"]["mean"] != rows["exact"]["mean"]
    assert (tmp_path / "fold_e2e_cpu_s7.md").read_text().count("\n| ") == len(rows) + 1
