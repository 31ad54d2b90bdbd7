"""The attention Triton kernels under the Triton CPU interpreter (small contexts, CI).

The checks live in interpreter_checks.py and run once, in a subprocess with TRITON_INTERPRET=1;
each is reported here as its own test.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("triton")

HERE = Path(__file__).resolve().parent
EXPECTED = [f"{k}_{t}" for t in ("int8_NHD_bs16", "bfloat16_HND_bs32", "int8_HND_bs48")
            for k in ("decode", "verify")] + [
    "verify_single_request_k6", "noncausal_blocks", "merge_poisoned_empty_segments",
    "verify_capture_seq_lens_one",
    "prefetch_and_m64_geometries", "int8_fp16_operands",
    "int_qk_error", "prefill_int8", "prefill_bfloat16",
    "prefill_expanded_gqa", "prefill_bf16_query", "prefill_warm_gather", "prefill_fresh_kv_int8",
    "prefill_fresh_kv_bfloat16", "mixed_int8", "mixed_bfloat16"]


@pytest.fixture(scope="module")
def results(triton_interpreter) -> dict:
    out = triton_interpreter(HERE / "interpreter_checks.py", timeout=900)
    return json.loads(out)


def test_all_checks_ran(results: dict) -> None:
    assert sorted(results) == sorted(EXPECTED)


@pytest.mark.parametrize("name", EXPECTED)
def test_check(results: dict, name: str) -> None:
    r = results.get(name)
    assert r is not None, f"{name} did not run"
    assert r["ok"], r["detail"]
