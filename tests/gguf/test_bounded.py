"""Malformed files are refused before anything is allocated from their counts: under 1 s and
200 MB each, with problem lists capped; files that are not regular files are refused without
being opened for reading."""

from __future__ import annotations

import os
import time
import tracemalloc
from pathlib import Path

import pytest

from vllm_prism.gguf.constants import GGUFValueType as T
from vllm_prism.gguf.errors import GGUFError
from vllm_prism.gguf.inspect import MAX_LISTED_PROBLEMS, capped, inspect_gguf

from test_serving_checks import rewrite  # noqa: E402 (tests/ is on sys.path)

BUDGET_S = 1.0
BUDGET_BYTES = 200 << 20


@pytest.fixture(scope="module")
def tiny(tiny_gguf) -> Path:
    return tiny_gguf("pq2_0")


def _measured(fn):
    tracemalloc.start()
    start = time.monotonic()
    try:
        result = fn()
    finally:
        elapsed = time.monotonic() - start
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return result, elapsed, peak


@pytest.mark.parametrize("key,named", [("qwen35.block_count", "qwen35.block_count"),
                                       ("qwen35.attention.head_count", "attn_q.weight")])
def test_huge_counts_are_refused_within_budget(key: str, named: str, tiny: Path,
                                               tmp_path: Path) -> None:
    bad = rewrite(tiny, tmp_path / "huge.gguf", {key: (3_000_000, T.UINT32, None)})
    report, elapsed, peak = _measured(lambda: inspect_gguf(bad))
    assert any(named in p for p in report.problems), report.problems
    assert elapsed < BUDGET_S and peak < BUDGET_BYTES, (elapsed, peak)
    assert sum(len(p) for p in report.problems) < 100_000


def test_problem_lists_are_capped() -> None:
    many = [f"problem {i}" for i in range(1000)]
    shown = capped(many)
    assert shown[:MAX_LISTED_PROBLEMS] == many[:MAX_LISTED_PROBLEMS]
    assert shown[-1] == f"and {1000 - MAX_LISTED_PROBLEMS} more" and len(shown) == 21


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.gguf"
    os.mkfifo(fifo)
    (_, elapsed, _) = _measured(lambda: pytest.raises(GGUFError, inspect_gguf, fifo))
    assert elapsed < BUDGET_S


def test_serving_refuses_a_fifo_by_name(tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    from vllm_prism.engine.arg_utils import check_gguf_for_serving

    fifo = tmp_path / "pipe.gguf"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match="not a regular file"):
        check_gguf_for_serving(fifo)
