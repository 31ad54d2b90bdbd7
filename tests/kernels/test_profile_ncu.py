"""CPU tests of benchmarks/kernels/profile_pq2_ncu.py's reading of Nsight Compute output: the
raw CSV page parsed into records (units converted), each record paired with its profiled case
in launch order, and the "bound by" rules."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "kernels"))
import profile_pq2_ncu as prof  # noqa: E402

METRICS = {"us": "gpu__time_duration.sum",
           "dram_pct": "dram__throughput.avg.pct_of_peak_sustained_elapsed",
           "grid": "launch__grid_size", "issue_pct":
           "smsp__issue_active.avg.pct_of_peak_sustained_active",
           "stall_long_scoreboard":
           "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio",
           "stall_barrier": "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio"}


def _raw_csv(rows: list[list[str]]) -> str:
    header = ["ID", "Kernel Name", *METRICS.values()]
    units = ["", "", "nsecond", "%", "", "%", "", ""]
    lines = ["==PROF== Connected to process 1", "CASES []"]
    for r in [header, units, *rows]:
        lines.append(",".join(f'"{v}"' for v in r))
    return "\n".join(lines)


def test_parse_raw_csv_reads_rows_in_order_and_converts_ns() -> None:
    text = _raw_csv([["0", "_act_kernel", "2,500", "41.5", "264", "12", "3.5", "0.2"],
                     ["1", "pq2_mma_int8_kernel", "9000", "77", "96", "20", "8", "1"]])
    rows = prof.parse_raw_csv(text, METRICS)
    assert [r["ncu_kernel"] for r in rows] == ["_act_kernel", "pq2_mma_int8_kernel"]
    assert rows[0]["us"] == pytest.approx(2.5) and rows[1]["us"] == pytest.approx(9.0)
    assert rows[1]["grid"] == 96 and rows[0]["dram_pct"] == pytest.approx(41.5)
    assert prof.parse_raw_csv("no csv here", METRICS) == []


@pytest.mark.parametrize("rec, expect", [
    ({"dram_pct": 85.0, "grid": 10, "issue_pct": 90}, "DRAM bandwidth"),
    ({"dram_pct": 30.0, "grid": 40, "stall_long_scoreboard": 9.0}, "too few CTAs (40 for 132"),
    ({"dram_pct": 30.0, "grid": 528, "issue_pct": 75, "stall_barrier": 2}, "instruction issue"),
    ({"dram_pct": 30.0, "grid": 528, "issue_pct": 20, "stall_long_scoreboard": 9.0,
      "stall_barrier": 2.0}, "memory latency"),
    ({"dram_pct": 30.0, "grid": 528, "issue_pct": 20, "stall_long_scoreboard": 1.0,
      "stall_barrier": 6.0}, "CTA barriers"),
    ({}, "unknown"),
])
def test_verdict_rules(rec: dict, expect: str) -> None:
    assert prof.verdict(rec, sms=132).startswith(expect)


def test_merge_groups_rows_by_marker_and_refuses_a_count_mismatch() -> None:
    """Each case's kernels are the rows between its marker and the next: the producer case
    one kernel, the attention case two (split and merge); a skipped case keeps its reason."""
    cases = [{"shape": "8x256", "M": 1, "kernel": "producer (gemv_a8)"},
             {"shape": "8x256", "M": 1, "kernel": "gemv_cuda", "skipped": "not built"},
             {"shape": "attention bf16 ctx 4096", "M": 1, "kernel": "decode"}]
    marker = {"ncu_kernel": prof.MARKER, "dram_pct": 0.1, "grid": 1}
    rows = [marker, {"ncu_kernel": "_act_kernel", "dram_pct": 80.0},
            marker, {"ncu_kernel": "_split_kv_kernel", "dram_pct": 75.0, "grid": 400},
            {"ncu_kernel": "_merge_kernel", "dram_pct": 5.0, "grid": 24}]
    out = prof.merge(cases, rows, sms=132)
    assert [(r["kernel"], r.get("ncu_kernel")) for r in out] == [
        ("producer (gemv_a8)", "_act_kernel"), ("gemv_cuda", None),
        ("decode", "_split_kv_kernel"), ("decode", "_merge_kernel")]
    assert out[0]["bound_by"].startswith("DRAM") and out[3]["bound_by"].startswith("too few")
    with pytest.raises(SystemExit, match="1 marked cases for 2 profiled"):
        prof.merge(cases, rows[:2], sms=132)


def test_wanted_metrics_keeps_known_base_names() -> None:
    known = {"gpu__time_duration", "dram__throughput"}
    assert set(prof.wanted_metrics(known)) == {"us", "dram_pct"}
    assert prof.wanted_metrics(None) == prof.METRICS


def test_write_results_table(tmp_path: Path) -> None:
    records = [{"shape": "8x256", "M": 1, "kernel": "gemv_a8", "auto": True, "us": 3.25,
                "dram_pct": 80.0, "grid": 4, "bound_by": "DRAM bandwidth (80 %)",
                "ncu_kernel": "_gemv_a8_kernel"},
               {"shape": "8x256", "M": 1, "kernel": "gemv_cuda", "skipped": "not built"}]
    md = prof.write_results(tmp_path, "h200", "cmd", records).with_suffix(".md").read_text()
    assert "| 8x256 | 1 | gemv_a8 | `_gemv_a8_kernel` | yes | 3.25 | 80.0 |" in md
    assert "not run: not built" in md
