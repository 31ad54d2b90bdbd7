"""The small-M dense GEMV (vllm_prism.kernels.dense_gemv) against ``F.linear`` (cuBLAS) on the
float projection Bonsai keeps: the Gated DeltaNet's ``in_proj_ba``, [96, 5120] bf16 in the 27B
model, at M = 1..16 (decode, small batches, speculative verification).

Timing: CUDA events around replays of a CUDA graph of many calls, each on its own copy of the
weight (copies past 3x the L2, so every call reads its weight from device memory, as in a
model step where 7 GB of other weights pass through the L2 between two layers); median per
call. The GEMV runs with programmatic dependent launch (as served on Hopper) and without.
``vs_torch`` = ``F.linear`` time / ours, in the same run; ``bw_frac`` = weight bytes / time /
the read bandwidth measured in the same run.

    python benchmarks/kernels/bench_dense_gemv.py [--out benchmarks/results]
    TRITON_INTERPRET=1 python benchmarks/kernels/bench_dense_gemv.py --cpu-smoke --out /tmp/x
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import timing  # noqa: E402
from vllm_prism.kernels.dense_gemv import small_m_linear  # noqa: E402

SHAPES = [(96, 5120)]  # (N, K): the 27B model's in_proj_ba
MS = [1, 2, 4, 6, 8, 16]
L2_MULTIPLE = 3


def run(shapes, ms, cpu: bool) -> dict:
    dev = "cpu" if cpu else "cuda"
    read_gbps = 1.0 if cpu else timing.read_bandwidth_gbps(dev)
    l2 = 1 << 16 if cpu else timing.l2_bytes()
    res = {"gpu": "cpu" if cpu else torch.cuda.get_device_name(),
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "command": "python " + " ".join(sys.argv), "read_gbps": read_gbps, "records": []}
    for n, k in shapes:
        wbytes = n * k * 2
        copies = 1 if cpu else max(1, min(512, math.ceil(L2_MULTIPLE * l2 / wbytes)))
        ws = [torch.randn(n, k, device=dev).bfloat16() / math.sqrt(k) for _ in range(copies)]
        for m in ms:
            x = torch.randn(m, k, device=dev).bfloat16()
            rec = {"n": n, "k": k, "m": m}
            rec["torch_us"] = timing.time_calls(
                [lambda w=w: torch.nn.functional.linear(x, w) for w in ws], cpu)
            for pdl in (True, False):
                us = timing.time_calls([lambda w=w: small_m_linear(x, w, pdl=pdl) for w in ws],
                                       cpu)
                rec["gemv_us" if pdl else "gemv_no_pdl_us"] = us
            y, ref = small_m_linear(x, ws[0]), x.double() @ ws[0].double().T
            rec["rel_err"] = ((y.double() - ref).norm() / ref.norm()).item()
            rec["vs_torch"] = rec["torch_us"] / rec["gemv_us"]
            rec["bw_frac"] = wbytes / (rec["gemv_us"] * 1e-6) / (read_gbps * 1e9)
            rec = {key: round(v, 4) if isinstance(v, float) else v for key, v in rec.items()}
            res["records"].append(rec)
            print(json.dumps(rec), flush=True)
    return res


def write(res: dict, out: Path, slug: str) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"dense_gemv_{slug}.json"
    path.write_text(json.dumps(res, indent=1) + "\n")
    lines = [f"# Small-M dense GEMV on {res['gpu']} ({res['date']})", "",
             f"Command: `{res['command']}`", "",
             f"Read bandwidth measured in the same run: {res['read_gbps']:.0f} GB/s. Times: "
             "median per call in CUDA graphs, each call on its own weight copy (past 3x the "
             "L2). `vs_torch` = `F.linear` / the GEMV with PDL.", "",
             "| N x K | M | F.linear us | GEMV us (PDL) | GEMV us (no PDL) | vs_torch | bw_frac "
             "| rel err |", "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['n']}x{r['k']} | {r['m']} | {r['torch_us']} | {r['gemv_us']} | "
              f"{r['gemv_no_pdl_us']} | {r['vs_torch']} | {r['bw_frac']} | {r['rel_err']:.2g} |"
              for r in res["records"]]
    path.with_suffix(".md").write_text("\n".join(lines) + "\n")
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--m", default=",".join(map(str, MS)))
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="run on the CPU (TRITON_INTERPRET=1) with a tiny shape, once")
    args = ap.parse_args()
    ms = [int(v) for v in args.m.split(",")]
    if args.cpu_smoke:
        res = run([(8, 256)], ms[:2], cpu=True)
        slug = "cpu-smoke"
    else:
        res = run(SHAPES, ms, cpu=False)
        slug = timing.gpu_slug()
    print(write(res, Path(args.out), slug).with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
