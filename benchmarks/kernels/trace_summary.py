"""The attention kernels' timelines as a results table.

`bash scripts/gpu-session.sh attn-trace` writes ``verify_trace.jsonl`` and
``decode_trace.jsonl`` (benchmarks/kernels/verify_trace.cu, decode_trace.cu: the device's line,
then one object per call). This script reads them on any machine and prints one markdown
table per kernel, with what to read off each row:

* verification: ``wait share``, the consumers' wait for their stages over their whole stage
  time, and ``free copies``, the kernel's time if its copies were free (the longest consumer's
  loop without its waits, with its start and end) over its time;
* decode: ``fixed``, the traced span less the iterations' stream (their count times a stage's
  wait and compute): the prologue, the first copy's latency, the end and the CTAs' spread;
* both, where the harness traced two launches: the CTAs' spread, each CTA's stream (decode: its
  copies issued to its loop's end; verification: its longer consumer's loop and output),
  ``tail share`` (the slowest CTA's stream less the mean, over the kernel's time: the most that
  handing the work out by the CTAs' pace could save), ``sm corr`` (near 1: the same
  multiprocessors are slow in both launches) and the slowest tenth's multiprocessors.

    python benchmarks/kernels/trace_summary.py verify_trace.jsonl decode_trace.jsonl \
        --title "H100, 2026-12-08" --out benchmarks/results/attention_trace_h100_2026-12-08.md
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

VERIFY_COLUMNS = [
    ("context", "context"), ("q_tokens", "q"), ("producer", "producer"),
    ("segments", "segments"), ("us", "us"),
    ("frac", "bw frac"), ("wait_us", "wait"), ("s_us", "S^T"), ("p_us", "softmax, P^T"),
    ("o_us", "O^T"), ("wait_share", "wait share"), ("pre_us", "pre"), ("post_us", "post"),
    ("prod_blocked_us", "producer blocked"), ("arrival_us", "arrival"),
    ("arrival_p90_us", "arrival p90"), ("compute_bound_us", "free copies us"),
    ("free_copies", "free copies"),
]
DECODE_COLUMNS = [
    ("context", "context"), ("copy", "copy"), ("segments", "segments"),
    ("partials", "partials"), ("ctas_with_work", "CTAs with work"), ("us", "us"),
    ("frac", "bw frac"),
    ("span_us", "span"), ("start_spread_us", "start spread"), ("prologue_us", "prologue"),
    ("first_wait_us", "first copy"), ("iterations", "iterations"), ("wait_us", "wait"),
    ("compute_us", "compute"), ("end_us", "end"), ("merge_us", "end: merge"),
    ("write_us", "end: writes"), ("end_spread_us", "end spread"),
    ("fixed_us", "fixed"),
]

SPREAD_COLUMNS = [
    ("us", "us"), ("stream_min_us", "stream min"), ("stream_p50_us", "median"),
    ("stream_mean_us", "mean"), ("stream_max_us", "max"), ("tail_us", "tail"),
    ("tail_share", "tail share"), ("lone_stream_us", "alone on its SM"),
    ("shared_stream_us", "sharing its SM"), ("sm_corr", "sm corr"), ("slow_sms", "slowest SMs"),
]


def read_lines(paths: list[Path]) -> tuple[dict, list[dict], list[dict]]:
    """The device's line and the verification and decode rows of the given files."""
    device: dict = {}
    verify: list[dict] = []
    decode: list[dict] = []
    for path in paths:
        for line in path.read_text().splitlines():
            line = line.strip()
            if not line.startswith("{"):
                continue
            row = json.loads(line)
            if "gpu" in row:
                device = row
            elif "q_tokens" in row:
                verify.append(row)
            elif "copy" in row:
                decode.append(row)
    return device, verify, decode


def with_derived(row: dict, kind: str) -> dict:
    """The row with its derived columns (module docstring)."""
    out = dict(row)
    if kind == "verify":
        steps = row["wait_us"] + row["s_us"] + row["p_us"] + row["o_us"]
        out["wait_share"] = row["wait_us"] / steps if steps > 0 else 0.0
        out["free_copies"] = row["compute_bound_us"] / row["us"] if row["us"] > 0 else 0.0
    else:
        stream = row["iterations"] * (row["wait_us"] + row["compute_us"])
        out["fixed_us"] = row["span_us"] - stream
    if "tail_us" in row:
        out["tail_share"] = row["tail_us"] / row["us"] if row["us"] > 0 else 0.0
    return out


def cell(value: object) -> str:
    if isinstance(value, list):
        return " ".join(str(v) for v in value)
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 10 else f"{value:.2f}"
    return str(value)


def table(rows: list[dict], columns: list[tuple[str, str]], kind: str) -> list[str]:
    lines = ["| " + " | ".join(title for _, title in columns) + " |",
             "|" + "---|" * len(columns)]
    for row in rows:
        full = with_derived(row, kind)
        lines.append("| " + " | ".join(cell(full.get(key, "")) for key, _ in columns) + " |")
    return lines


def summary(paths: list[Path], title: str) -> str:
    device, verify, decode = read_lines(paths)
    out = [f"# Attention kernels' timelines, {title}", ""]
    if device:
        out += [f"{device.get('gpu', '?')}, {device.get('sms', '?')} SMs, read bandwidth "
                f"{device.get('read_gbps', '?')} GB/s (measured in the run); times in us.", ""]
    if verify:
        out += ["## Verification (int8_verify_wgmma.cu, lazy maxima)", ""]
        out += table(verify, VERIFY_COLUMNS, "verify") + [""]
    if decode:
        out += ["## Decode (int8_decode.cu, the kernel alone, without the merge)", ""]
        out += table(decode, DECODE_COLUMNS, "decode") + [""]
    for rows, keys, kind, name in ((verify, VERIFY_COLUMNS[:4], "verify", "Verification"),
                                   (decode, DECODE_COLUMNS[:5], "decode", "Decode")):
        traced = [r for r in rows if "tail_us" in r]
        if traced:
            out += [f"## {name}: the CTAs' spread (streams in us, two launches)", ""]
            out += table(traced, keys + SPREAD_COLUMNS, kind) + [""]
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--title", default="")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    text = summary(args.files, args.title)
    if args.out is not None:
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
