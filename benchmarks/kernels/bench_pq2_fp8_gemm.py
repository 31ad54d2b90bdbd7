"""Prefill GEMM on FP8 tensor cores (vllm_prism/kernels/pq2/triton_fp8.py) against bf16.

For each Bonsai 2 projection shape and prefill size M: the time of bf16 ``F.linear`` on the
dense weight (the baseline of perf/targets.md), of ``gemm_dq`` (the automatic prefill kernel:
the weight dequantized to bf16, then ``F.linear``), and of the FP8 path (the activation
quantized to e4m3 per 1x128 block, the codes written as e4m3, ``torch._scaled_mm`` with
1x128 block scales on both operands), with the FP8 path's parts timed alone; and each path's
relative L2 error against an fp32 reference on the same weight. Times are medians of CUDA
graph replays (4 calls a graph) in one run; ratios are bf16 time / path time.

    python benchmarks/kernels/bench_pq2_fp8_gemm.py --out /tmp/out
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench_pq2_linear import random_weight  # noqa: E402
from timing import gpu_slug, time_graph  # noqa: E402
from vllm_prism.kernels.pq2.triton_dequant import dequantize_pq2  # noqa: E402
from vllm_prism.kernels.pq2.triton_fp8 import (gemm_fp8, pq2_codes_fp8,  # noqa: E402
                                               quantize_fp8_1x128)

SHAPES = [(12288, 5120), (34816, 5120), (5120, 6144), (5120, 17408)]
MS = [512, 2048, 4096]


def median_us(fn, reps: int) -> float:
    """Microseconds a call in a CUDA graph of 4 calls (no launch overhead from Python)."""
    return time_graph([fn] * 4, replays=reps)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref).norm() / ref.norm()).item()


def run_shape(n: int, k: int, m: int, gen: torch.Generator, reps: int) -> dict:
    w = random_weight(n, k, gen)
    x = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
    dense = dequantize_pq2(w, torch.bfloat16)
    ref = x.float() @ dense.float().t()
    xq, xs = quantize_fp8_1x128(x)
    wq, ws = pq2_codes_fp8(w)
    out_fp8 = gemm_fp8(x, w)
    rec = {
        "shape": f"{n}x{k}", "m": m,
        "bf16_us": median_us(lambda: F.linear(x, dense), reps),
        "gemm_dq_us": median_us(lambda: F.linear(x, dequantize_pq2(w, torch.bfloat16)), reps),
        "fp8_us": median_us(lambda: gemm_fp8(x, w), reps),
        "fp8_mm_us": median_us(lambda: torch._scaled_mm(xq, wq.t(), scale_a=xs, scale_b=ws,
                                                        out_dtype=torch.bfloat16), reps),
        "fp8_codes_us": median_us(lambda: pq2_codes_fp8(w), reps),
        "fp8_act_us": median_us(lambda: quantize_fp8_1x128(x), reps),
        "err_bf16": rel_err(F.linear(x, dense), ref),
        "err_fp8": rel_err(out_fp8, ref),
        "codes_exact": bool(torch.equal(wq.float() * ws.t().repeat_interleave(128, 1),
                                        dense.float())),
    }
    for key in ("gemm_dq", "fp8", "fp8_mm"):
        rec[f"{key}_vs_bf16"] = rec["bf16_us"] / rec[f"{key}_us"]
    return rec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--shapes", default=",".join(f"{n}x{k}" for n, k in SHAPES))
    ap.add_argument("--m", default=",".join(map(str, MS)))
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    recs = []
    for shape in args.shapes.split(","):
        n, k = map(int, shape.split("x"))
        for m in map(int, args.m.split(",")):
            recs.append(run_shape(n, k, m, gen, args.reps))
            print(json.dumps(recs[-1]), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    slug = gpu_slug()
    head = (f"{datetime.date.today()}, `python benchmarks/kernels/bench_pq2_fp8_gemm.py "
            f"{' '.join(sys.argv[1:])}`, {torch.cuda.get_device_name()}, torch "
            f"{torch.__version__}. Times in us (CUDA graph replays), ratios = bf16 "
            "F.linear time / time; errors: relative L2 against fp32 on the same weight.")
    cols = ["shape", "m", "bf16_us", "gemm_dq_us", "fp8_us", "fp8_mm_us", "fp8_codes_us",
            "fp8_act_us", "gemm_dq_vs_bf16", "fp8_vs_bf16", "fp8_mm_vs_bf16", "err_bf16",
            "err_fp8", "codes_exact"]
    lines = [f"# PQ2 prefill on FP8 tensor cores, {slug}", "", head, "",
             "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in recs:
        lines.append("| " + " | ".join(
            f"{r[c]:.4g}" if isinstance(r[c], float) else str(r[c]) for c in cols) + " |")
    (out / f"pq2_fp8_gemm_{slug}.md").write_text("\n".join(lines) + "\n")
    (out / f"pq2_fp8_gemm_{slug}.json").write_text(json.dumps(
        {"gpu": torch.cuda.get_device_name(), "date": str(datetime.date.today()),
         "command": head, "records": recs}, indent=1) + "\n")


if __name__ == "__main__":
    main()
