"""The int8 activation producer, Triton against CUDA C++ (``VLLM_PRISM_PRODUCER``), alone and
in front of its linear, on the prologues and shapes of the Bonsai 2 27B model.

Each case is a linear of the model with what feeds it: the Gated DeltaNet's ``in_proj_qkvz``
(16384x5120; the residual add and RMSNorm, the normalized input returned for ``in_proj_ba``),
``gate_up_proj`` (34816x5120; the residual add and RMSNorm), ``down_proj`` (5120x17408; the
SiLU-and-multiply), the Gated DeltaNet's ``out_proj`` (5120x6144; the per-head norm and its SiLU
gate) and the attention's ``o_proj`` (5120x6144; the sigmoid gate), at M = 1, 2 and 6 rows.

Timing: CUDA events around replays of a CUDA graph of many calls (median per call), with
programmatic dependent launch as served on Hopper: ``producer`` a chain of producer launches
alone, ``linear`` the producer and the automatic int8 kernel of the linear, each call on its
own weight copy (copies past 3x the L2, so every call reads its weights from device memory).
``speedup`` = the Triton time / the CUDA C++ time, in the same run.

    python benchmarks/kernels/bench_producer.py [--m 1,2,6] [--out benchmarks/results]
    TRITON_INTERPRET=1 python benchmarks/kernels/bench_producer.py --cpu-smoke --out /tmp/x
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import timing  # noqa: E402
from vllm_prism.kernels.pq2.dispatch import pq2_linear_fused, select_kernel  # noqa: E402
from vllm_prism.kernels.pq2.hadamard import (ActKind, Prologue,  # noqa: E402
                                             cuda_producer_problem, transform_activation)
from vllm_prism.kernels.pq2.layout import PQ2Weight  # noqa: E402

# (name, N, K, prologue kind) in the model's order
CASES = [("in_proj_qkvz", 16384, 5120, "add_rmsnorm_input"),
         ("gate_up_proj", 34816, 5120, "add_rmsnorm"),
         ("down_proj", 5120, 17408, "glu"),
         ("out_proj", 5120, 6144, "gated_head_norm"),
         ("o_proj", 5120, 6144, "sigmoid_gate")]
PRODUCER_CALLS = 64
L2_MULTIPLE = 3


def make_input(kind: str, m: int, k: int, dev: str) -> tuple[torch.Tensor, Prologue]:
    """(x, prologue) of one prologue kind, bf16."""
    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=dev).bfloat16()

    w = torch.rand(k, device=dev).bfloat16() - 0.5
    if kind.startswith("add_rmsnorm"):
        return rnd(m, k), Prologue(residual=rnd(m, k), rms_weight=w, rms_offset=1.0,
                                   return_input=kind.endswith("input"))
    if kind == "glu":
        return rnd(m, 2 * k), Prologue(glu=True)
    if kind == "gated_head_norm":
        return rnd(m, k), Prologue(rms_weight=torch.rand(128, device=dev) + 0.5,
                                   rms_group=128, gate=rnd(m, 2 * k)[:, k:])
    return rnd(m, k), Prologue(gate=rnd(m, k), gate_sigmoid=True)


def random_weight(n: int, k: int, signs: torch.Tensor, dev: str) -> PQ2Weight:
    codes = torch.randint(-2**31, 2**31 - 1, (n, k // 16), dtype=torch.int32, device=dev)
    scales = (torch.rand(n, k // 128, device=dev) * 0.02).half()
    return PQ2Weight.of_planes(codes, scales, signs, 1024)


def run(ms: list[int], cpu: bool) -> dict:
    dev = "cpu" if cpu else "cuda"
    l2 = 1 << 16 if cpu else timing.l2_bytes()
    cases = [(name, 64, 1024, kind) for name, _, _, kind in CASES[:2]] if cpu else CASES
    res = {"gpu": "cpu" if cpu else torch.cuda.get_device_name(),
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "command": "python " + " ".join(sys.argv), "records": []}
    for name, n, k, kind in cases:
        signs = torch.where(torch.rand(k, device=dev) < 0.5, -1.0, 1.0)
        copies = 1 if cpu else max(1, min(64, math.ceil(L2_MULTIPLE * l2 / (n * k / 4))))
        ws = [random_weight(n, k, signs, dev) for _ in range(copies)]
        for m in ms:
            x, pro = make_input(kind, m, k, dev)
            rec = {"linear": name, "n": n, "k": k, "m": m, "prologue": kind,
                   "kernel": select_kernel(m, ws[0], x.dtype, pro).name}
            for prod in ("triton", "cuda"):
                os.environ["VLLM_PRISM_PRODUCER"] = prod
                if prod == "cuda" and cuda_producer_problem(x, k, 1024, ActKind.Q8, pro):
                    rec[f"{prod}_skipped"] = cuda_producer_problem(x, k, 1024, ActKind.Q8, pro)
                    continue
                rec[f"{prod}_producer_us"] = timing.time_calls(
                    [lambda: transform_activation(x, signs, 1024, ActKind.Q8, prologue=pro)]
                    * (1 if cpu else PRODUCER_CALLS), cpu)
                rec[f"{prod}_linear_us"] = timing.time_calls(
                    [lambda w=w: pq2_linear_fused(x, w, None, pro) for w in ws], cpu)
            os.environ.pop("VLLM_PRISM_PRODUCER")
            if "cuda_linear_us" in rec:
                rec["producer_speedup"] = rec["triton_producer_us"] / rec["cuda_producer_us"]
                rec["linear_speedup"] = rec["triton_linear_us"] / rec["cuda_linear_us"]
            rec = {key: round(v, 3) if isinstance(v, float) else v for key, v in rec.items()}
            res["records"].append(rec)
            print(json.dumps(rec), flush=True)
    return res


def write(res: dict, out: Path, slug: str) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"producer_{slug}.json"
    path.write_text(json.dumps(res, indent=1) + "\n")
    lines = [f"# The int8 activation producer, Triton against CUDA C++, on {res['gpu']} "
             f"({res['date']})", "", f"Command: `{res['command']}`", "",
             "Median us per call in CUDA graphs with PDL; `linear`: the producer and the "
             "automatic int8 kernel, each call on its own weight copy (past 3x the L2); "
             "speedup = Triton / CUDA C++.", "",
             "| linear | N x K | M | prologue | kernel | producer Triton | producer CUDA | "
             "speedup | linear Triton | linear CUDA | speedup |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in res["records"]:
        def cell(key: str, r=r) -> str:
            return str(r.get(key, "-"))
        lines.append(f"| {r['linear']} | {r['n']}x{r['k']} | {r['m']} | {r['prologue']} | "
                     f"{r['kernel']} | {cell('triton_producer_us')} | "
                     f"{cell('cuda_producer_us')} | {cell('producer_speedup')} | "
                     f"{cell('triton_linear_us')} | {cell('cuda_linear_us')} | "
                     f"{cell('linear_speedup')} |")
    path.with_suffix(".md").write_text("\n".join(lines) + "\n")
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--m", default="1,2,6")
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="run on the CPU (TRITON_INTERPRET=1), tiny shapes, Triton only")
    args = ap.parse_args()
    ms = [int(v) for v in args.m.split(",")]
    res = run(ms[:1] if args.cpu_smoke else ms, cpu=args.cpu_smoke)
    slug = "cpu-smoke" if args.cpu_smoke else timing.gpu_slug()
    print(write(res, Path(args.out), slug).with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
