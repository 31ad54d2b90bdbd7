"""Markdown tables from the JSON lines of benchmarks/kernels/pq2_small_sweep.cu.

    python benchmarks/kernels/small_sweep_report.py RUN.jsonl [RUN2.jsonl ...]

For each run: the GPU and its sustained read bandwidth, then per shape and M the streaming
probe's time for the same bytes, the best of the library's other small-batch kernels and the
GEMV, mma_lean's default geometry and its best one, each as microseconds (the better of PDL
off and on) and the ratio to the best other kernel; then mma_lean's default t(M) / t(1).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _best_us(row: dict) -> float:
    return min(row["us"], row["us_pdl"])


def report(path: Path) -> str:
    """The tables of one run."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    head = rows[0]
    out = [f"### {path.name}: {head['gpu']}, {head['sms']} SMs, sustained read "
           f"{head['read_gbps']} GB/s", "",
           "| shape | M | probe us | best other (us) | mma_lean default (us, x other) "
           "| mma_lean best (us, x other) |", "|---|---|---|---|---|---|"]
    timed = [r for r in rows if r.get("ok")]
    groups: dict[tuple[str, int], list[dict]] = {}
    for r in timed:
        groups.setdefault((r["shape"], r["M"]), []).append(r)
    probes = {(r["shape"], r["M"]): r["probe_us"] for r in rows if r.get("summary")}
    default_us: dict[tuple[str, int], float] = {}
    for (shape, m), rs in groups.items():
        other = min((r for r in rs if r["kernel"] != "mma_lean_cuda"), key=_best_us)
        lean = [r for r in rs if r["kernel"] == "mma_lean_cuda"]
        if not lean:
            continue
        dflt = next(r for r in lean if r["config"].startswith("default"))
        best = min(lean, key=_best_us)
        o, d, b = _best_us(other), _best_us(dflt), _best_us(best)
        default_us[(shape, m)] = d
        out.append(f"| {shape} | {m} | {probes.get((shape, m), float('nan')):.2f} | "
                   f"{other['kernel']} {o:.2f} | {dflt['config'][8:]}: {d:.2f} "
                   f"({o / d:.2f}x) | {best['config'].replace('default ', '')}: {b:.2f} "
                   f"({o / b:.2f}x) |")
    out += ["", "mma_lean default, t(M) / t(1):", ""]
    for shape in sorted({s for s, _ in default_us}):
        ms = sorted(m for s, m in default_us if s == shape)
        if 1 in ms:
            t1 = default_us[(shape, 1)]
            out.append(f"- {shape}: " + ", ".join(
                f"M = {m} {default_us[(shape, m)] / t1:.2f}" for m in ms if m > 1))
    return "\n".join(out) + "\n"


def main() -> None:
    for name in sys.argv[1:]:
        sys.stdout.write(report(Path(name)) + "\n")


if __name__ == "__main__":
    main()
