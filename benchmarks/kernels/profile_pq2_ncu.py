"""What bounds each PQ2 and attention kernel: Nsight Compute counters at the Bonsai shapes.

For each shape, batch size M and kernel (the automatic choice and the candidates), the linear
runs once inside a profiler range on an activation prepared before it (caches flushed by ncu
before each kernel, clocks left alone), and ncu reads every kernel the call launches: its
duration, DRAM throughput, SM throughput, achieved and theoretical occupancy, issue-slot use,
registers, grid and the warp stall reasons. The activation producer (``_act_kernel``:
prologue, signs, Hadamard, int8 layout) is profiled once per (shape, M) as its own case. With
``--attention``, the PRISM decode and verification attention (Bonsai 2 27B's full-attention
layer: 24 query heads, 4 KV heads, head dim 256) at each context, BF16 and INT8 caches. A
marker kernel opens each case in the trace, so a call of several kernels (split and merge)
keeps them together. Each kernel row gets a "bound by" verdict from its counters (the rules
are in :func:`verdict`), written to benchmarks/results/pq2_ncu_<gpu>.md / .json.

    python benchmarks/kernels/profile_pq2_ncu.py                      # default shapes and M
    python benchmarks/kernels/profile_pq2_ncu.py --shapes 12288x5120 --m 1,8 --kernels mma_cuda
    python benchmarks/kernels/profile_pq2_ncu.py --shapes none --attention 32768,131072

Needs ``ncu`` (Nsight Compute) with access to the hardware counters; the child process
(``--child``) is what ncu runs.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from sass_summary import ncu_number  # noqa: E402 (this directory)
from vllm_prism.kernels.common import HAS_TRITON  # noqa: E402

if HAS_TRITON:
    import triton
    import triton.language as tl

MARKER = "_ncu_case_marker"  # the kernel that opens each case in the trace
BLOCK = 16  # vLLM's KV-cache block size
SHAPES = [(12288, 5120), (34816, 5120), (5120, 6144), (5120, 17408), (1024, 5120),
          (248320, 5120)]
M_LIST = [1, 8, 16, 64, 512]
STALLS = ["long_scoreboard", "short_scoreboard", "barrier", "mio_throttle", "lg_throttle",
          "math_pipe_throttle", "wait", "not_selected", "no_instruction", "dispatch_stall",
          "membar", "branch_resolving", "drain", "imc_miss", "sleeping", "tex_throttle",
          "selected"]
METRICS = {
    "us": "gpu__time_duration.sum",
    "dram_pct": "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "dram_bytes_read": "dram__bytes_read.sum",
    "sm_pct": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "occupancy_pct": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "theoretical_occupancy_pct": "sm__maximum_warps_per_active_cycle_pct",
    "issue_pct": "smsp__issue_active.avg.pct_of_peak_sustained_active",
    "registers": "launch__registers_per_thread",
    "grid": "launch__grid_size",
    "block": "launch__block_size",
    **{f"stall_{r}": f"smsp__average_warps_issue_stalled_{r}_per_issue_active.ratio"
       for r in STALLS},
}


# ------------------------------------------------------------------------- the child

if HAS_TRITON:

    @triton.jit
    def _ncu_case_marker(ptr):
        """Opens a case in the trace (one program, one store)."""
        tl.store(ptr, 1)



def child_cases(shapes: list[tuple[int, int]], m_list: list[int],
                kernels: list[str] | None) -> list[dict]:
    """Run every linear case once inside a profiler range; return the cases in launch
    order."""
    import torch

    from bench_pq2_linear import random_weight
    from vllm_prism.kernels.pq2 import dispatch

    gen = torch.Generator(device="cuda").manual_seed(0)
    cap = torch.cuda.get_device_capability()
    cudart = torch.cuda.cudart()
    cases: list[dict] = []
    for n, k in shapes:
        w = random_weight(n, k, gen)
        for m in m_list:
            x = torch.randn(m, k, device="cuda", generator=gen).bfloat16()
            auto = dispatch.select_kernel(m, w, x.dtype)
            names = [auto.name] + [c for c in (kernels or _candidates(m)) if c != auto.name]
            producer_done = False
            for name in names:
                kern = dispatch._BY_NAME.get(name)
                if kern is None:
                    cases.append({"shape": f"{n}x{k}", "M": m, "kernel": name,
                                  "skipped": "no such kernel"})
                    continue
                ok, why = kern.is_supported(cap)
                if ok:
                    ok, why = kern.can_implement(dispatch.PQ2LinearConfig.of(m, w, x.dtype))
                if not ok:
                    cases.append({"shape": f"{n}x{k}", "M": m, "kernel": name, "skipped": why})
                    continue
                act = kern.make_activation(x, w)
                for _ in range(2):  # compile and warm up outside the profiled range
                    kern.run(act, w, None, x.dtype)
                if not producer_done:  # the producer this kernel family reads, once
                    _profiled(cudart, lambda: kern.make_activation(x, w))
                    cases.append({"shape": f"{n}x{k}", "M": m, "kernel": f"producer ({name})",
                                  "auto": False})
                    producer_done = True
                _profiled(cudart, lambda: kern.run(act, w, None, x.dtype))
                cases.append({"shape": f"{n}x{k}", "M": m, "kernel": name,
                              "auto": name == auto.name})
        w = None  # freed (a del would unbind the name the lambdas above read)
        torch.cuda.empty_cache()
    return cases


def _candidates(m: int) -> list[str]:
    """The kernels bench_pq2_linear.py times at this M (its one list), those the dispatch
    table names (not its pseudo-kernel variants)."""
    from bench_pq2_linear import candidates

    from vllm_prism.kernels.pq2 import dispatch

    return [c for c in candidates(m) if c in dispatch._BY_NAME]


def attention_cases(contexts: list[int], verify_q: int) -> list[dict]:
    """Decode (one query token) and verification (``verify_q`` tokens) attention at each
    context, BF16 and INT8 caches, one request on a shuffled block table."""
    import torch

    from bench_attention import HKV, HQ, HS  # Bonsai 2 27B's full-attention layer
    from vllm_prism.attention.ops import (AttentionMetadata, decode_attention, make_kv_cache,
                                          verify_attention)

    cudart = torch.cuda.cudart()
    cases: list[dict] = []
    for kv_name, dtype in (("bf16", torch.bfloat16), ("int8", torch.int8)):
        for ctx in contexts:
            blocks = -(-ctx // BLOCK)
            cache = make_kv_cache(blocks + 1, HKV, BLOCK, HS, dtype, "NHD", "cuda",
                                  fill="random")
            table = torch.randperm(blocks, generator=torch.Generator().manual_seed(ctx))
            table = table.to(torch.int32).unsqueeze(0).cuda()
            for q_len, fn in ((1, decode_attention), (verify_q, verify_attention)):
                md = AttentionMetadata.build(table, [ctx], [q_len])
                q = torch.randn(q_len, HQ, HS, device="cuda", dtype=torch.bfloat16)
                out = torch.empty_like(q)
                for _ in range(2):  # compile and warm up outside the profiled range
                    fn(q, cache, md, out=out)
                _profiled(cudart, lambda: fn(q, cache, md, out=out))
                cases.append({"shape": f"attention {kv_name} ctx {ctx}", "M": q_len,
                              "kernel": "decode" if q_len == 1 else "verify", "auto": True})
            cache = None
            torch.cuda.empty_cache()
    return cases


def _profiled(cudart, fn) -> None:
    """``fn`` inside a profiler range, after the case marker."""
    import torch

    flag = torch.zeros(1, dtype=torch.int32, device="cuda")
    _ncu_case_marker[(1,)](flag)  # compiled outside the range
    torch.cuda.synchronize()
    cudart.cudaProfilerStart()
    _ncu_case_marker[(1,)](flag)
    fn()
    torch.cuda.synchronize()
    cudart.cudaProfilerStop()


# ------------------------------------------------------------------------ the parent


def available_metrics(ncu: str) -> set[str] | None:
    """Base names of the metrics this ncu knows for the GPU (None when it cannot say)."""
    try:
        out = subprocess.run([ncu, "--query-metrics"], capture_output=True, text=True,
                             timeout=120).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    names = {line.split()[0] for line in out.splitlines() if line[:1].isalpha()
             and "__" in line.split()[0]}
    return names or None


def wanted_metrics(known: set[str] | None) -> dict[str, str]:
    """METRICS less those whose base name this ncu does not list."""
    if known is None:
        return dict(METRICS)
    return {k: v for k, v in METRICS.items()
            if v.split(".")[0] in known or v in known}


def parse_raw_csv(text: str, metrics: dict[str, str]) -> list[dict]:
    """ncu ``--csv --page raw`` output: a header row, a units row, then one row per kernel.
    Lines that are not CSV rows (the program's own output, ``==PROF==`` lines) are skipped."""
    rows = [line for line in text.splitlines() if line.startswith('"')]
    if len(rows) < 2:
        return []
    table = list(csv.reader(io.StringIO("\n".join(rows))))
    header, body = table[0], table[2:]
    col = {name: i for i, name in enumerate(header)}
    out = []
    for r in body:
        rec = {"ncu_kernel": r[col["Kernel Name"]] if "Kernel Name" in col else ""}
        for key, metric in metrics.items():
            if metric in col:
                rec[key] = ncu_number(r[col[metric]])
        if "us" in rec and rec["us"] is not None:
            rec["us"] = rec["us"] / 1e3  # ncu reports gpu__time_duration in ns
        out.append(rec)
    return out


def verdict(rec: dict, sms: int) -> str:
    """What bounds the kernel, from its counters:

    - DRAM throughput >= 70 % of peak: the memory bandwidth (the roofline);
    - a grid of fewer CTAs than multiprocessors: too few CTAs (tail / narrow shape);
    - issue slots busy >= 60 %: the instruction issue rate (decode arithmetic);
    - otherwise the dominant warp stall: long scoreboard = memory latency with too few loads
      in flight, barrier / mio = shared-memory staging, math pipe = the tensor or integer pipe.
    """
    dram, issue, grid = rec.get("dram_pct"), rec.get("issue_pct"), rec.get("grid")
    stalls = sorted(((v, k.removeprefix("stall_")) for k, v in rec.items()
                     if k.startswith("stall_") and v is not None and k != "stall_selected"),
                    reverse=True)
    top = ", ".join(f"{name} {v:.1f}" for v, name in stalls[:2])
    if dram is not None and dram >= 70:
        return f"DRAM bandwidth ({dram:.0f} %)"
    if grid is not None and grid < sms:
        return f"too few CTAs ({grid:.0f} for {sms} SMs); stalls: {top or 'n/a'}"
    if issue is not None and issue >= 60:
        return f"instruction issue ({issue:.0f} % of slots); stalls: {top or 'n/a'}"
    if stalls:
        name = stalls[0][1]
        why = {"long_scoreboard": "memory latency: too few loads in flight",
               "barrier": "CTA barriers", "mio_throttle": "shared-memory / MIO queue",
               "short_scoreboard": "shared-memory latency",
               "math_pipe_throttle": "a math pipe", "lg_throttle": "global load queue",
               "wait": "fixed-latency dependencies", "no_instruction": "instruction fetch",
               "dispatch_stall": "dispatch", "not_selected": "enough eligible warps"}
        return f"{why.get(name, name)} (stalls: {top})"
    return "unknown (counters missing)"


def write_results(out_dir: Path, gpu: str, command: str, records: list[dict]) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"pq2_ncu_{gpu}.json"
    doc = {"gpu": gpu, "date": datetime.date.today().isoformat(), "command": command,
           "records": records}
    path.write_text(json.dumps(doc, indent=1) + "\n")
    lines = [f"# PQ2 kernels under Nsight Compute on {gpu} ({doc['date']})", "",
             f"Command: `{command}`", "",
             "One launch per row, caches flushed before it, clocks not locked "
             "(`ncu --clock-control none`). `auto`: the automatic choice at that M. "
             "Stalls: warps stalled per issued instruction.", "",
             "| shape | M | kernel | launched | auto | us | DRAM % | SM % | issue % | "
             "occupancy % (theor.) | regs | grid | bound by |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        if "skipped" in r:
            lines.append(f"| {r['shape']} | {r['M']} | {r['kernel']} | | | | | | | | | | "
                         f"not run: {r['skipped']} |")
            continue
        f = lambda key, d=1: ("-" if r.get(key) is None  # noqa: E731
                              else f"{r[key]:.{d}f}")
        launched = r.get("ncu_kernel", "").split("(")[0][:40]
        lines.append(f"| {r['shape']} | {r['M']} | {r['kernel']} | `{launched}` | "
                     f"{'yes' if r.get('auto') else ''} | {f('us', 2)} | {f('dram_pct')} | "
                     f"{f('sm_pct')} | {f('issue_pct')} | {f('occupancy_pct')} "
                     f"({f('theoretical_occupancy_pct', 0)}) | {f('registers', 0)} | "
                     f"{f('grid', 0)} | {r.get('bound_by', '')} |")
    path.with_suffix(".md").write_text("\n".join(lines) + "\n")
    return path


def group_by_marker(rows: list[dict]) -> list[list[dict]]:
    """The kernel rows of each case: a marker row opens a case; rows before the first marker
    (none expected) are dropped."""
    groups: list[list[dict]] = []
    for r in rows:
        if MARKER in r.get("ncu_kernel", ""):
            groups.append([])
        elif groups:
            groups[-1].append(r)
    return groups


def merge(cases: list[dict], rows: list[dict], sms: int) -> list[dict]:
    """One record per kernel a profiled case launched (the case's fields, the kernel's
    counters, a verdict), in launch order; skipped cases keep one record with the reason."""
    run = [c for c in cases if "skipped" not in c]
    groups = group_by_marker(rows)
    if len(run) != len(groups):
        raise SystemExit(f"ncu returned {len(groups)} marked cases for {len(run)} profiled "
                         "cases (were the hardware counters readable?)")
    it = iter(groups)
    out = []
    for c in cases:
        if "skipped" in c:
            out.append(c)
            continue
        for row in next(it):
            rec = {**c, **row}
            rec["bound_by"] = verdict(rec, sms)
            out.append(rec)
    return out


def _find_ncu() -> str:
    """``ncu`` on the PATH, else the newest under /opt/nvidia/nsight-compute."""
    found = shutil.which("ncu")
    if found:
        return found
    installed = sorted(Path("/opt/nvidia").glob("nsight-compute/*/ncu"))
    return str(installed[-1]) if installed else "ncu"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default=",".join(f"{n}x{k}" for n, k in SHAPES),
                   help="NxK list (output x input features)")
    p.add_argument("--m", default=",".join(map(str, M_LIST)), help="batch sizes")
    p.add_argument("--kernels", help="kernels besides the automatic choice (default: the "
                   "Triton and CUDA C++ candidates of each M)")
    p.add_argument("--attention", default="", help="contexts for the attention cases, e.g. "
                   "4096,32768,131072 (none by default)")
    p.add_argument("--verify-q", type=int, default=6, help="query tokens of a verify step")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    p.add_argument("--ncu", default=_find_ncu())
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    shapes = ([] if args.shapes == "none"
              else [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")])
    m_list = [int(v) for v in args.m.split(",")]
    kernels = args.kernels.split(",") if args.kernels else None
    contexts = [int(v) for v in args.attention.split(",") if v]
    if args.child:
        cases = child_cases(shapes, m_list, kernels)
        cases += attention_cases(contexts, args.verify_q) if contexts else []
        print("CASES " + json.dumps(cases), flush=True)
        return
    import torch

    from timing import gpu_slug

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    child = [sys.executable, __file__, "--child", "--shapes", args.shapes, "--m", args.m,
             "--attention", args.attention, "--verify-q", str(args.verify_q)]
    if args.kernels:
        child += ["--kernels", args.kernels]
    # every metric first; where this ncu rejects a name, those it lists; then no stalls
    filtered = wanted_metrics(available_metrics(args.ncu))
    tries = [METRICS, filtered, {k: v for k, v in filtered.items() if "stall" not in k}]
    for metrics in tries:
        proc = subprocess.run([args.ncu, "--clock-control", "none", "--profile-from-start",
                               "off", "--metrics", ",".join(metrics.values()), "--csv",
                               "--page", "raw", *child],
                              capture_output=True, text=True,
                              env={**os.environ, "PYTHONUNBUFFERED": "1"})
        cases = [json.loads(line[len("CASES "):]) for line in proc.stdout.splitlines()
                 if line.startswith("CASES ")]
        if not proc.returncode and cases:
            break
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:] + "\n")
        print(f"ncu run failed (exit {proc.returncode}) with {len(metrics)} metrics",
              file=sys.stderr, flush=True)
    else:
        raise SystemExit("every ncu run failed (see above)")
    records = merge(cases[-1], parse_raw_csv(proc.stdout, metrics), sms)
    command = "python benchmarks/kernels/profile_pq2_ncu.py " + " ".join(sys.argv[1:])
    path = write_results(Path(args.out), gpu_slug(), command, records)
    print(path.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
