"""benchmarks/kernels/trace_summary.py on hand-written timeline lines (the device's, one
verification call without the CTAs' spread, as the harnesses wrote before they traced two
launches, one decode call with it, a line that is not JSON): the rows sorted by kind and the
derived columns, each worked out by hand below."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "kernels"))

import trace_summary  # noqa: E402

DEVICE = {"gpu": "NVIDIA H100 80GB HBM3", "sms": 132, "read_gbps": 3196}
VERIFY = {"context": 32768, "q_tokens": 6, "producer": "tma", "segments": 66, "ctas": 132,
          "us": 40.0, "frac": 0.5, "wait_us": 1.5, "s_us": 0.5, "p_us": 1.0, "o_us": 1.0,
          "pre_us": 2.0, "post_us": 1.0, "prod_blocked_us": 0.25, "arrival_us": 3.0,
          "arrival_p90_us": 4.0, "compute_bound_us": 30.0}
DECODE = {"context": 4096, "copy": "cp_async", "segments": 256, "partials": "fp16", "us": 12.0,
          "frac": 0.2, "span_us": 11.0, "start_spread_us": 1.0, "prologue_us": 0.5,
          "first_wait_us": 2.0,
          "iterations": 2.0, "wait_us": 0.75, "compute_us": 1.25, "end_us": 1.5,
          "merge_us": 0.5, "write_us": 1.0, "end_spread_us": 0.5, "ctas_with_work": 64,
          "stream_min_us": 5.0, "stream_p50_us": 6.0,
          "stream_mean_us": 6.5, "stream_max_us": 9.5, "tail_us": 3.0, "lone_stream_us": 5.5,
          "shared_stream_us": 7.0, "sm_corr": 0.9, "slow_sms": [3, 17]}


def _write(tmp_path: Path) -> tuple[Path, Path]:
    verify = tmp_path / "verify_trace.jsonl"
    verify.write_text(json.dumps(DEVICE) + "\n" + json.dumps(VERIFY) + "\n")
    decode = tmp_path / "decode_trace.jsonl"
    decode.write_text("compiler chatter\n" + json.dumps(DEVICE) + "\n" + json.dumps(DECODE) + "\n")
    return verify, decode


def test_rows_by_kind(tmp_path: Path) -> None:
    device, verify, decode = trace_summary.read_lines(list(_write(tmp_path)))
    assert device["read_gbps"] == 3196
    assert [r["producer"] for r in verify] == ["tma"]
    assert [r["copy"] for r in decode] == ["cp_async"]


def test_derived_columns() -> None:
    v = trace_summary.with_derived(VERIFY, "verify")
    # wait 1.5 of 1.5 + 0.5 + 1.0 + 1.0 = 4.0 us a stage; 30 of 40 us with free copies
    assert v["wait_share"] == 1.5 / 4.0
    assert v["free_copies"] == 0.75
    d = trace_summary.with_derived(DECODE, "decode")
    # span 11 us less 2 iterations x (0.75 + 1.25) us
    assert d["fixed_us"] == 7.0
    # the slowest CTA's 3 us past the mean, of the kernel's 12 us
    assert d["tail_share"] == 0.25
    assert "tail_share" not in v


def test_tables(tmp_path: Path) -> None:
    verify, decode = _write(tmp_path)
    out = tmp_path / "summary.md"
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks/kernels/trace_summary.py"),
                          str(verify), str(decode), "--title", "test", "--out", str(out)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    text = out.read_text()
    assert "NVIDIA H100 80GB HBM3, 132 SMs, read bandwidth 3196 GB/s" in text
    rows = [line for line in text.splitlines() if line.startswith("| 32768") or
            line.startswith("| 4096")]
    assert len(rows) == 3  # verification, decode, decode's spread
    verify_cells = [c.strip() for c in rows[0].strip("|").split("|")]
    assert verify_cells[:5] == ["32768", "6", "tma", "66", "40.00"]
    assert verify_cells[10] == "0.375"  # wait share
    assert verify_cells[-1] == "0.750"  # free copies
    decode_cells = [c.strip() for c in rows[1].strip("|").split("|")]
    assert decode_cells[:6] == ["4096", "cp_async", "256", "fp16", "64", "12.00"]
    assert decode_cells[-1] == "7.000"  # fixed
    assert decode_cells[14:17] == ["1.500", "0.500", "1.000"]  # the end, its merge, its writes
    # the spread: a table for decode only (the verification line has none)
    assert "## Decode: the CTAs' spread" in text and "## Verification: the CTAs'" not in text
    cells = [c.strip() for c in rows[2].strip("|").split("|")]
    assert cells[:6] == ["4096", "cp_async", "256", "fp16", "64", "12.00"]
    assert cells[11] == "0.250"  # tail share
    assert cells[-2:] == ["0.900", "3 17"]  # sm corr, the slowest SMs
