"""The attention Triton kernels under the Triton CPU interpreter (small contexts, CI).

The checks live in interpreter_checks.py and run once, in a subprocess with TRITON_INTERPRET=1;
each is reported here as its own test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

HERE = Path(__file__).resolve().parent
EXPECTED = [f"{k}_{t}" for t in ("int8_NHD_bs16", "bfloat16_HND_bs32", "int8_HND_bs48")
            for k in ("decode", "verify")] + [
    "verify_single_request_k6", "prefetch_and_m64_geometries", "int_qk_error", "prefill_int8", "prefill_bfloat16",
    "prefill_expanded_gqa", "prefill_bf16_query", "mixed_int8", "mixed_bfloat16"]


@pytest.fixture(scope="module")
def results() -> dict:
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join(
        [str(HERE), str(HERE.parents[1]), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, str(HERE / "interpreter_checks.py")], env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_all_checks_ran(results: dict) -> None:
    assert sorted(results) == sorted(EXPECTED)


@pytest.mark.parametrize("name", EXPECTED)
def test_check(results: dict, name: str) -> None:
    r = results.get(name)
    assert r is not None, f"{name} did not run"
    assert r["ok"], r["detail"]
