"""The PQ2 Triton kernels under the Triton CPU interpreter (tiny shapes, CI without a GPU).

The checks live in pq2_interpreter_checks.py and run once, in a subprocess with
TRITON_INTERPRET=1; each check is reported here as its own test.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("triton")

HERE = Path(__file__).resolve().parent
EXPECTED = 52  # 2 shapes x 4 M x (producer + kernels + auto) + 10 extra checks


@pytest.fixture(scope="module")
def results(triton_interpreter) -> dict:
    out = triton_interpreter(HERE / "pq2_interpreter_checks.py", timeout=600)
    return json.loads(out)


def test_all_checks_ran(results: dict) -> None:
    assert len(results) == EXPECTED, sorted(results)


def test_every_check_passes(results: dict) -> None:
    failed = {k: v["detail"] for k, v in results.items() if not v["ok"]}
    assert not failed, "\n\n".join(f"{k}:\n{v}" for k, v in failed.items())
