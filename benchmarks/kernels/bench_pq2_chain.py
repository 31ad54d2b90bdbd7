"""A decode step's PQ2 linears in sequence: what the linears of a layer cost back to back,
against the read bandwidth measured in the same run.

Each layer runs the four linears of a Bonsai 2 27B Gated DeltaNet layer at M = 1 (``--m``
for more rows: the small-batch kernels) (12288x5120, 5120x6144, 34816x5120, 5120x17408: 96 MB
of PQ2 weights), through the dispatcher's automatic choice (the activation producer + the
CUDA C++ GEMV where ``vllm_prism._C`` is built), every layer with its own weights.
``--gap-us`` puts a spinning kernel after the input projection of each layer, standing in for
the Gated DeltaNet's own kernels (about 15 us a layer at batch 1). ``--engine-like`` runs each
linear as the Bonsai model does inside vLLM: weights with folded Hadamard signs (block 1024)
and the producers' prologues (add-RMSNorm with the residual before the input projection and
gate_up, the grouped gated norm before out_proj, SiLU-GLU before down), to tell whether a
kernel's figure outside the engine survives the producers it meets there.

``--parts all weights producers`` times the chain whole (``all``: each linear's producer
and weight kernel, as the engine runs them), its weight kernels alone on activations made
before the graph (``weights``), and its producers alone (``producers``): what the
hand-over between them costs is ``all`` minus the other two.

Timing: a CUDA graph of all layers (weights past 3x the L2 in all), replayed; median
microseconds a layer; ``bw_frac`` = weight bytes of a layer / time / the read bandwidth
measured in the same run (the gap counts in the time; for ``producers`` it only says how
their time compares). (Until 2026-12-02 it also timed an L2
prefetch of the next linear's weights, slower in every case and since removed:
benchmarks/results/pq2_chain_h200*.md, pq2_linear_h200_notes.md.)

    python benchmarks/kernels/bench_pq2_chain.py [--layers 12] [--gap-us 0 15] [--out DIR]
        [--engine-like] [--m 6] [--parts all weights producers]
    TRITON_INTERPRET=1 python benchmarks/kernels/bench_pq2_chain.py --cpu-smoke --out /tmp/x
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import timing  # noqa: E402
from vllm_prism.kernels.pq2.dispatch import (TorchKernel, pq2_linear_fused,  # noqa: E402
                                              select_kernel)
from vllm_prism.kernels.pq2.hadamard import NO_PROLOGUE, Prologue  # noqa: E402
from vllm_prism.kernels.pq2.layout import PQ2Weight  # noqa: E402

SHAPES = [(12288, 5120), (5120, 6144), (34816, 5120), (5120, 17408)]  # (N, K) in step order


HADAMARD_BLOCK = 1024  # the Bonsai files' rotation block (../shared/spec/bonsai2-gguf.md),
# or the largest power of two dividing a smaller K


def random_weight(n: int, k: int, g: torch.Generator, device: str,
                  signs: bool = False) -> PQ2Weight:
    codes = torch.randint(-2**31, 2**31 - 1, (n, k // 16), dtype=torch.int32, device=device,
                          generator=g)
    scales = (torch.rand(n, k // 128, device=device, generator=g) * 0.02).half()
    if not signs:
        return PQ2Weight.of_planes(codes, scales, None, None)
    s = torch.randint(0, 2, (k,), device=device, generator=g).float() * 2 - 1
    return PQ2Weight.of_planes(codes, scales, s, min(HADAMARD_BLOCK, k & -k))


def plain_prologues(shapes: list[tuple[int, int]]) -> list[tuple[Prologue, int]]:
    """Each linear of a layer with no prologue, reading x of its K."""
    return [(NO_PROLOGUE, k) for _, k in shapes]


def engine_prologues(shapes: list[tuple[int, int]], m: int,
                     device: str) -> list[tuple[Prologue, int]]:
    """Each linear of a layer (``SHAPES``' order) as the Bonsai model feeds it, with the width
    of the x it reads: add-RMSNorm with the residual (the input projection), the grouped gated
    norm of head dim 128 (out_proj), add-RMSNorm (gate_up), SiLU-GLU (down)."""
    def bf16(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=device, dtype=torch.bfloat16)
    out = []
    for i, (_, k) in enumerate(shapes):
        if i % 4 == 1:
            out.append((Prologue(rms_weight=bf16(128), rms_group=128, gate=bf16(m, k)), k))
        elif i % 4 == 3:
            out.append((Prologue(glu=True), 2 * k))
        else:
            out.append((Prologue(residual=bf16(m, k), rms_weight=bf16(k), rms_offset=1.0), k))
    return out


def check_engine_like(layer: list[PQ2Weight], xs: dict[int, torch.Tensor],
                      prologues: list[tuple[Prologue, int]]) -> float:
    """The largest relative error of a layer's linears, each with its prologue, against the
    torch reference (dequantized weight, fp32 producer): the engine-like path's wiring."""
    worst = 0.0
    for w, (pro, width) in zip(layer, prologues):
        y = pq2_linear_fused(xs[width], w, None, pro)[0].float()
        ref = TorchKernel.run(TorchKernel.make_activation(xs[width], w, pro), w, None,
                              torch.float32)
        worst = max(worst, ((y - ref).norm() / ref.norm().clamp_min(1e-30)).item())
    return worst


def spin_cycles(us: float) -> int:
    """GPU clock cycles of ``us`` microseconds at the device's reported clock."""
    rate_khz = torch.cuda.get_device_properties(0).clock_rate  # kHz
    return int(us * rate_khz / 1e3)


PARTS = ("all", "weights", "producers")


def chain_calls(layers: list[list[PQ2Weight]], xs: dict[int, torch.Tensor],
                prologues: list[tuple[Prologue, int]], part: str = "all"
                ) -> list[list[Callable[[], object]]]:
    """Each layer's linears as calls (see the module docstring for ``part``): the weight
    kernel's activations for ``weights`` are made here, once a linear of the first layer
    (every layer's linear i has the same shape and prologue)."""
    if part == "all":
        return [[lambda w=w, pro=pro, width=width: pq2_linear_fused(xs[width], w, None, pro)
                 for w, (pro, width) in zip(ws, prologues)] for ws in layers]
    picks = [(select_kernel(xs[width].shape[0], w, torch.bfloat16, pro), pro, width)
             for w, (pro, width) in zip(layers[0], prologues)]
    if part == "producers":
        return [[lambda w=w, k=k, pro=pro, width=width: k.make_activation(xs[width], w, pro)
                 for w, (k, pro, width) in zip(ws, picks)] for ws in layers]
    if part != "weights":
        raise ValueError(f"part {part!r}: one of {', '.join(PARTS)}")
    acts = [k.make_activation(xs[width], w, pro)
            for w, (k, pro, width) in zip(layers[0], picks)]
    return [[lambda w=w, k=k, a=a: k.run(a, w, None, torch.bfloat16)
             for w, (k, _, _), a in zip(ws, picks, acts)] for ws in layers]


def time_chain(layers: list[list[PQ2Weight]], xs: dict[int, torch.Tensor], gap_cycles: int,
               prologues: list[tuple[Prologue, int]], replays: int = 10,
               part: str = "all") -> float:
    """Median microseconds a layer of a graph of every layer (on the CPU, one eager pass),
    each linear of a layer through its prologue and x of its width (``part``: the whole
    linear, its weight kernel or its producer, :func:`chain_calls`)."""
    calls = chain_calls(layers, xs, prologues, part)

    def step() -> None:
        for layer in calls:
            for i, call in enumerate(layer):
                call()
                if i == 0 and gap_cycles:
                    torch.cuda._sleep(gap_cycles)

    if not torch.cuda.is_available():  # --cpu-smoke: the script's path, no timing to keep
        t0 = time.perf_counter()
        step()
        return (time.perf_counter() - t0) * 1e6 / len(layers)
    step()  # warm-up (compiles the producer)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / len(layers))
    del graph
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--gap-us", type=float, nargs="+", default=[0.0, 15.0])
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--m", type=int, default=1,
                    help="activation rows (1: decode; 6: a verification step of 5 drafts)")
    ap.add_argument("--engine-like", action="store_true",
                    help="folded Hadamard signs and the model's prologues on every linear")
    ap.add_argument("--parts", nargs="+", default=["all"], choices=PARTS,
                    help="the whole chain, its weight kernels alone, its producers alone")
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="run the script on the CPU (TRITON_INTERPRET=1), two tiny layers")
    args = ap.parse_args()
    shapes, device = SHAPES, "cuda"
    if args.cpu_smoke:
        shapes, device, args.layers, args.gap_us = [(64, 256), (32, 384)], "cpu", 2, [0.0]
        if args.engine_like:  # the four prologues, at tiny sizes
            shapes = [(64, 256), (32, 384), (96, 256), (32, 128)]
    read_gbps = 1.0 if args.cpu_smoke else timing.read_bandwidth_gbps("cuda")
    g = torch.Generator(device=device).manual_seed(0)
    engine = args.engine_like
    layers = [[random_weight(n, k, g, device, engine) for n, k in shapes]
              for _ in range(args.layers)]
    prologues = engine_prologues(shapes, args.m, device) if engine else plain_prologues(shapes)
    xs = {w: torch.randn(args.m, w, device=device, dtype=torch.bfloat16)
          for w in {w for _, w in prologues}}
    layer_bytes = sum(w.codes.numel() * 4 + w.scales.numel() * 2 for w in layers[0])
    kernels = sorted({select_kernel(args.m, w, torch.bfloat16).name for w in layers[0]})
    res = {"gpu": "cpu" if args.cpu_smoke else torch.cuda.get_device_name(),
           "command": "python " + " ".join(sys.argv),
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "read_gbps": read_gbps, "layers": args.layers, "m": args.m,
           "engine_like": engine,
           "layer_bytes": layer_bytes,
           "kernels": kernels, "records": []}
    if engine:
        res["check_rel_err"] = check_engine_like(layers[0], xs, prologues)
        print(json.dumps({"check_rel_err": res["check_rel_err"]}), flush=True)
    for gap in args.gap_us:
        for part in args.parts:
            us = time_chain(layers, xs, spin_cycles(gap) if gap else 0, prologues, part=part)
            # the producers alone read no weights: no share of the bandwidth to give
            frac = (None if part == "producers"
                    else round(layer_bytes / (us * 1e-6) / (read_gbps * 1e9), 3))
            rec = {"gap_us": gap, "part": part, "us_per_layer": round(us, 2), "bw_frac": frac}
            res["records"].append(rec)
            print(json.dumps(rec), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    slug = "cpu-smoke" if args.cpu_smoke else timing.gpu_slug()
    path = out / (f"pq2_chain_{slug}{'' if args.m == 1 else f'_m{args.m}'}"
                  f"{'_engine' if engine else ''}.json")
    path.write_text(json.dumps(res, indent=1) + "\n")
    lines = [f"# PQ2 linears of a decode step in sequence ({res['gpu']}, {res['date']})", "",
             f"Command: `{res['command']}`", "",
             f"{args.layers} layers of {layer_bytes / 1e6:.1f} MB (the four Gated DeltaNet-layer "
             f"linears of the 27B model at M = {args.m}"
             f"{', signs and prologues as in the engine' if engine else ''}, kernels "
             f"{', '.join(kernels)}); read "
             f"bandwidth {read_gbps:.0f} GB/s in the same run.", "",
             "| gap after the input projection (us) | part | us a layer | bw_frac |",
             "|---|---|---|---|"]
    lines += [f"| {r['gap_us']:g} | {r['part']} | {r['us_per_layer']} | "
              f"{'-' if r['bw_frac'] is None else r['bw_frac']} |"
              for r in res["records"]]
    path.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print(path.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
