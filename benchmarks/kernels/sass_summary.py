"""Where a kernel's stall samples go, from Nsight Compute's SASS source page.

`bash scripts/gpu-session.sh sass CTX Q` writes ``attn_sass.csv`` (``ncu --page source --csv
--print-source sass``: one section per profiled kernel, a row per SASS instruction with its
executed count, its warp stall samples and their reasons). This script reads that file on any
machine and prints, for each kernel whose name contains ``--kernel``, the stall reasons' shares,
the opcodes' shares of instructions and samples, and the code's straight runs (consecutive
instructions executed the same number of times: a loop body, a branch's side, a prologue)
with the most samples, which is where to look first; and the samples by executed count (every
instruction executed N times together, wherever it lies: a kernel's prologue and end run once
a warp, its loop body once a warp and iteration, so the rows of the smallest counts against
those of the loop's count split fixed cost from per-iteration cost even where branches cut
the code into many short runs).

    python benchmarks/kernels/sass_summary.py attn_sass.csv --kernel verify --top 15
"""

from __future__ import annotations

import argparse
import collections
import csv
from dataclasses import dataclass, field

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


@dataclass
class Kernel:
    name: str
    rows: list[dict[str, str]] = field(default_factory=list)


def ncu_number(text: str) -> float | None:
    """A number as Nsight Compute's CSV pages print it (thousands separated by commas), None
    where the cell holds none."""
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def _num(text: str) -> float:
    return ncu_number(text) or 0.0


def read_kernels(path: str) -> list[Kernel]:
    """The kernels of a source-page CSV, each with its instruction rows."""
    kernels: list[Kernel] = []
    header: list[str] | None = None
    with open(path, newline="") as f:
        for row in csv.reader(f):
            if not row:
                continue
            if row[0] == "Kernel Name":
                kernels.append(Kernel(row[1]))
                header = None
            elif row[0] == "Address":
                header = row
            elif header is not None and kernels:
                kernels[-1].rows.append(dict(zip(header, row)))
    return kernels


def opcode(source: str) -> str:
    """The SASS opcode of an instruction's text, without its predicate and modifiers."""
    words = source.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else "?"


def stall_shares(rows: list[dict[str, str]]) -> list[tuple[str, float]]:
    """Each stall reason's share of the samples, largest first."""
    reasons = [c for c in (rows[0] if rows else {})
               if c.startswith("stall_") and "Not Issued" not in c]
    totals = collections.Counter({r[6:]: sum(_num(row[r]) for row in rows) for r in reasons})
    whole = sum(totals.values()) or 1.0
    return [(r, v / whole) for r, v in totals.most_common() if v > 0]


def runs(rows: list[dict[str, str]]) -> list[tuple[int, int, float, float]]:
    """Straight runs of instructions executed equally often: (first row, last row, executed
    count, samples)."""
    out: list[tuple[int, int, float, float]] = []
    for i, row in enumerate(rows):
        n, s = _num(row[EXECUTED]), _num(row[SAMPLES])
        if out and out[-1][2] == n:
            first, _, _, acc = out[-1]
            out[-1] = (first, i, n, acc + s)
        else:
            out.append((i, i, n, s))
    return out


def by_count(rows: list[dict[str, str]]) -> list[tuple[float, int, float]]:
    """(executed count, instructions, samples) for each executed count, most samples first
    (rows never executed left out)."""
    ins: collections.Counter = collections.Counter()
    smp: collections.Counter = collections.Counter()
    for r in rows:
        n = _num(r[EXECUTED])
        if n > 0:
            ins[n] += 1
            smp[n] += _num(r[SAMPLES])
    return sorted(((n, ins[n], smp[n]) for n in ins), key=lambda x: (-x[2], x[0]))


def summarize(kernel: Kernel, top: int) -> list[str]:
    rows = kernel.rows
    samples = sum(_num(r[SAMPLES]) for r in rows) or 1.0
    executed = sum(_num(r[EXECUTED]) for r in rows) or 1.0
    lines = [f"{kernel.name}: {len(rows)} instructions, {executed:,.0f} warp instructions "
             f"executed, {samples:,.0f} stall samples",
             "stalls: " + ", ".join(f"{r} {v:.3f}" for r, v in stall_shares(rows)[:10])]
    ins, smp = collections.Counter(), collections.Counter()
    for r in rows:
        op = opcode(r["Source"])
        ins[op] += _num(r[EXECUTED])
        smp[op] += _num(r[SAMPLES])
    lines.append("| opcode | instructions | samples |")
    lines.append("|---|---|---|")
    lines += [f"| {op} | {n / executed:.3f} | {smp[op] / samples:.3f} |"
              for op, n in ins.most_common(top)]
    lines.append("| rows | executed | instructions | samples | first instruction |")
    lines.append("|---|---|---|---|---|")
    for first, last, n, s in sorted(runs(rows), key=lambda x: -x[3])[:top]:
        lines.append(f"| {first}-{last} | {n:,.0f} | {last - first + 1} | {s / samples:.3f} | "
                     f"`{rows[first]['Source'][:48]}` |")
    lines.append("| executed count | instructions | samples |")
    lines.append("|---|---|---|")
    lines += [f"| {n:,.0f} | {k} | {s / samples:.3f} |" for n, k, s in by_count(rows)[:top]]
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", help="ncu --page source --csv --print-source sass output")
    ap.add_argument("--kernel", default="", help="kernels whose name contains this")
    ap.add_argument("--top", type=int, default=12, help="opcodes and runs to list")
    args = ap.parse_args()
    for kernel in read_kernels(args.csv):
        if args.kernel in kernel.name:
            print("\n".join(summarize(kernel, args.top)), end="\n\n")


if __name__ == "__main__":
    main()
