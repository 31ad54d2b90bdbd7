"""Benchmark of the PQ2 linear op (vllm_prism.kernels.pq2) on a CUDA GPU.

For each Bonsai 2 shape and batch size M it reports the median time of ``pq2_linear`` (the
activation producer with the signed Hadamard plus the chosen kernel, as the model runs it),
the bytes it must move (codes + scales + activation + output), the share of the read
bandwidth measured in the same run by a large read-only reduction, the ratio to torch bf16
``F.linear`` on dense weights of the same shape, and t(M) / t(1).

On Hopper and newer, where programmatic dependent launch is on (``VLLM_PRISM_PDL``, on by
default), ``us`` is timed with it and ``us_no_pdl`` without, in the same run.

Timing: CUDA events around replays of a CUDA graph that holds many calls, each call on a
different copy of the weights (enough copies to exceed 3x the L2 cache, so every call
streams its weights from device memory); time per call = median replay time / calls.

    python benchmarks/kernels/bench_pq2_linear.py                 # writes benchmarks/results/
    python benchmarks/kernels/bench_pq2_linear.py --sweep --out /tmp/sweep   # tile sweep

``--sweep`` times every tile variant of each kernel family (kernel only, on a prepared
activation) after checking its output against the torch reference, to choose defaults.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from timing import (env_setting, gpu_slug, l2_bytes, read_bandwidth_gbps,  # noqa: E402
                    time_graph)
from vllm_prism.kernels.common import use_pdl  # noqa: E402
from vllm_prism.kernels.pq2 import dispatch  # noqa: E402
from vllm_prism.kernels.pq2.hadamard import ActKind, transform_activation  # noqa: E402
from vllm_prism.kernels.pq2.layout import PQ2Weight  # noqa: E402
from vllm_prism.kernels.pq2.triton_gemv import GemvConfig, gemv_a8, gemv_a16  # noqa: E402
from vllm_prism.kernels.pq2.triton_mma import TCConfig, pq2_tc_linear  # noqa: E402

SHAPES = [(1024, 5120), (12288, 5120), (10240, 5120), (6144, 5120), (14336, 5120),
          (34816, 5120), (5120, 6144), (5120, 17408), (248320, 5120)]
M_LIST = [1, 2, 4, 8, 16, 32, 64, 128, 512, 2048]
HADAMARD_BLOCK = 1024
L2_MULTIPLE = 3
DEVICE = "cuda"


def copies_for(nbytes: int) -> int:
    return max(1, min(256, math.ceil(L2_MULTIPLE * l2_bytes() / max(nbytes, 1))))


# ------------------------------------------------------------------------------- inputs


def random_weight(n: int, k: int, gen: torch.Generator) -> PQ2Weight:
    """Random codes (all four, code 3 included), scales in [0.5, 1.5) * 0.02, random signs."""
    g = k // 128
    raw = torch.randint(0, 256, (n, g, 34), dtype=torch.uint8, device=DEVICE, generator=gen)
    d = ((torch.rand(n, g, device=DEVICE, generator=gen) + 0.5) * 0.02).half()
    raw[:, :, :2] = d.view(torch.uint8).reshape(n, g, 2)
    signs = torch.where(torch.rand(k, device=DEVICE, generator=gen) < 0.5, -1.0, 1.0)
    return PQ2Weight.from_raw(raw.reshape(n, g * 34), signs, HADAMARD_BLOCK)


def clone_weight(w: PQ2Weight) -> PQ2Weight:
    """A copy at other addresses (the same codes: ternary as ``w`` is)."""
    return PQ2Weight(codes=w.codes.clone(), scales=w.scales.clone(), n=w.n, k=w.k,
                     signs=w.signs, hadamard_block=w.hadamard_block, ternary=w.is_ternary())


def op_bytes(m: int, n: int, k: int, weight_bytes: int, act_bytes: int = 2) -> int:
    return weight_bytes + m * k * act_bytes + m * n * act_bytes


def reference(x: torch.Tensor, w: PQ2Weight, wf: torch.Tensor) -> torch.Tensor:
    """fp32 reference: exact transform (gguf.hadamard) and the fp32 dense weight wf."""
    from vllm_prism.gguf.hadamard import forward_transform
    xt = forward_transform(x.float(), w.signs, w.hadamard_block)
    return xt @ wf.T


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return ((y.float() - ref).norm() / ref.norm()).item()


# -------------------------------------------------------------------------------- sweep

GEMV_A8_CONFIGS = [GemvConfig(8, 8, 2), GemvConfig(16, 8, 4), GemvConfig(16, 16, 4),
                   GemvConfig(32, 8, 4)]
# More weight tiles in flight per program, their scales with them (issue 11: the M = 1 GEMV
# reaches 30-50 % of the read bandwidth on the mid-size shapes; latency-bound is the guess).
_GEMV_BASE = list(GEMV_A8_CONFIGS)
GEMV_A8_CONFIGS += [dataclasses.replace(c, depth=d, prefetch_scales=True)
                    for c in _GEMV_BASE for d in (1, 2, 3)]
# and K split over programs (more programs on the narrow outputs: 5120 rows)
GEMV_A8_CONFIGS += [dataclasses.replace(c, depth=2, prefetch_scales=True, split_k=s)
                    for c in _GEMV_BASE for s in (2, 4)]
GEMV_A16_CONFIGS = [GemvConfig(16, 8, 4)]
GEMV_M = [2, 4, 8, 16]
MMA_M = [16, 32, 64]
GEMM_M = [128, 512, 2048]


def mma_configs(m: int, n: int, k: int) -> list[TCConfig]:
    bm = 16 if m <= 16 else (32 if m <= 32 else 64)
    out = []
    for bn in (64, 128):
        tiles = -(-n // bn)
        split = 1
        while tiles * split < 132 and split < 8 and (k // 128) // (split * 2) >= 4:
            split *= 2
        for s in sorted({1, split}):
            out.append(TCConfig(block_n=bn, block_m=bm, split_k=s, num_warps=4, num_stages=4))
    return out


# K splits of the CUDA C++ tensor-core kernel (0: its own choice, partial sums over 2x the
# SMs): at M = 8 it moves 16-21 % of DRAM throughput (Nsight Compute, 2026-12-01) and each
# split adds a workspace round trip, so fewer, longer splits may pay.
MMA_CUDA_SPLITS = [0, 1, 2, 3, 4, 6, 8]
# Tile variants of the Triton prefill GEMM (pq2_tc_linear) the sweep times at M > 64, by
# activation family.
GEMM_CONFIGS = {
    "a16": [TCConfig(128, 128, 1, 8, 3), TCConfig(64, 128, 1, 4, 3), TCConfig(128, 64, 1, 4, 3)],
    "a8": [TCConfig(64, 128, 1, 4, 3), TCConfig(128, 64, 1, 4, 3), TCConfig(64, 64, 1, 4, 4)],
}


def _mma_cuda(a, w, split: int) -> torch.Tensor:
    return torch.ops._C_prism.pq2_mma_int8(w.codes, w.scales, a.data, a.group_scale,
                                           a.group_sum, None, torch.bfloat16, split, False)


def _cuda_kernels(m: int, w: PQ2Weight) -> list[type[dispatch.PQ2LinearKernel]]:
    """The CUDA C++ kernels of vllm_prism._C that can run this call (every dispatch entry on
    one of its ops: built here, and M and K within its range)."""
    cap = torch.cuda.get_device_capability()
    cfg = dispatch.PQ2LinearConfig.of(m, w, torch.bfloat16)
    return [kern for kern in dispatch.KERNELS if issubclass(kern, dispatch._CudaOpKernel)
            and kern.is_supported(cap)[0] and kern.can_implement(cfg)[0]]


def sweep_shape(n: int, k: int, gen: torch.Generator, results: list[dict],
                m_filter: set[int] | None) -> None:
    w0 = random_weight(n, k, gen)
    ws = [w0] + [clone_weight(w0) for _ in range(copies_for(w0.nbytes) - 1)]
    calls_n = max(len(ws), 20)
    shape = f"{n}x{k}"
    wf = w0.dequantize(torch.float32)

    def record(**kw):
        kw["shape"] = shape
        results.append(kw)
        print(json.dumps(kw), flush=True)

    def run_variant(family, m, cfg, act, fn, tol, ref):
        try:
            y = fn(act, ws[0], cfg)
            err = rel_err(y, ref)
            ok = math.isfinite(err) and err < tol
            us = time_graph([lambda i=i: fn(act, ws[i % len(ws)], cfg) for i in range(calls_n)])
            record(family=family, M=m, config=repr(cfg), us=us, err=err, ok=ok)
        except Exception as e:  # keep sweeping; report the failure
            record(family=family, M=m, config=repr(cfg), error=f"{type(e).__name__}: {e}"[:400])

    ms = sorted({1, *GEMV_M, *MMA_M, *(GEMM_M if n < 100000 else [128])})
    for m in ms:
        if m_filter and m not in m_filter:
            continue
        x = torch.randn(m, k, device=DEVICE, generator=gen).bfloat16()
        ref = reference(x, w0, wf)
        aq = transform_activation(x, w0.signs, HADAMARD_BLOCK, ActKind.Q8)
        if m == 1:
            for kind in (ActKind.Q8, ActKind.F32_PERM, ActKind.FLOAT):
                us = time_graph([lambda: transform_activation(x, w0.signs, HADAMARD_BLOCK, kind)
                                 for _ in range(20)])
                record(family=f"producer_{kind.name}", M=1, us=us)
            a16 = transform_activation(x, w0.signs, HADAMARD_BLOCK, ActKind.F32_PERM)
            for cfg in GEMV_A16_CONFIGS:
                run_variant("gemv_a16", 1, cfg, a16,
                            lambda a, w, c: gemv_a16(a, w, config=c), 1e-2, ref)
        for kern in _cuda_kernels(m, w0):
            if kern.name == "mma_cuda":
                if 1 < m <= 64:
                    for split in MMA_CUDA_SPLITS:
                        run_variant("mma_cuda", m, split, aq, _mma_cuda, 3e-2, ref)
            else:
                run_variant(kern.name, m, "default", aq,
                            lambda a, w, c, kern=kern: kern.run(a, w, None, torch.bfloat16),
                            3e-2, ref)
        if m <= 16:
            for c0 in GEMV_A8_CONFIGS:
                cfg = dataclasses.replace(c0, block_m=1 << (m - 1).bit_length())
                run_variant("gemv_a8", m, cfg, aq,
                            lambda a, w, c: gemv_a8(a, w, config=c), 3e-2, ref)
            if m < 16:
                continue
        af = transform_activation(x, w0.signs, HADAMARD_BLOCK, ActKind.FLOAT)
        tc = lambda a, w, c: pq2_tc_linear(a, w, config=c)  # noqa: E731
        if m <= 64:
            for cfg in mma_configs(m, n, k):
                run_variant("mma_a16", m, cfg, af, tc, 1e-2, ref)
                run_variant("mma_a8", m, cfg, aq, tc, 3e-2, ref)
        else:
            for fam, cfgs in GEMM_CONFIGS.items():
                for cfg in cfgs:
                    run_variant(f"gemm_{fam}", m, cfg, aq if fam == "a8" else af, tc,
                                3e-2 if fam == "a8" else 1e-2, ref)
        # dense bf16 baseline
        wd = w0.dequantize(torch.bfloat16)
        dense = [wd] + [wd.clone() for _ in range(copies_for(wd.numel() * 2) - 1)]
        xt = af.data
        us = time_graph([lambda i=i: F.linear(xt, dense[i % len(dense)])
                         for i in range(max(len(dense), 20))])
        record(family="bf16_linear", M=m, us=us)
        dense = wd = None  # freed (a del would unbind the names the lambdas above read)
    if not m_filter or 1 in m_filter:
        wd = w0.dequantize(torch.bfloat16)
        dense = [wd] + [wd.clone() for _ in range(copies_for(wd.numel() * 2) - 1)]
        x1 = torch.randn(1, k, device=DEVICE, generator=gen).bfloat16()
        us = time_graph([lambda i=i: F.linear(x1, dense[i % len(dense)])
                         for i in range(max(len(dense), 20))])
        record(family="bf16_linear", M=1, us=us)
    ws = wf = None
    torch.cuda.empty_cache()


# ---------------------------------------------------------------------------- benchmark


def bench_shape(n: int, k: int, m_list: list[int], gen: torch.Generator, read_gbps: float,
                records: list[dict], only: list[str] | None = None) -> None:
    w0 = random_weight(n, k, gen)
    ws = [w0] + [clone_weight(w0) for _ in range(copies_for(w0.nbytes) - 1)]
    wd = w0.dequantize(torch.bfloat16)
    dense = [wd] + [wd.clone() for _ in range(copies_for(wd.numel() * 2) - 1)]
    shape = f"{n}x{k}"
    wf = w0.dequantize(torch.float32)
    t1 = None
    for m in m_list:
        if n > 100000 and m > 128:
            continue  # lm_head runs on the last token of a prefill only
        x = torch.randn(m, k, device=DEVICE, generator=gen).bfloat16()
        kernel = dispatch.select_kernel(m, w0, x.dtype)
        ref = reference(x, w0, wf)
        y = dispatch.pq2_linear(x, w0)
        err = rel_err(y, ref)
        calls = max(len(ws), 20)
        us = time_graph([lambda i=i: dispatch.pq2_linear(x, ws[i % len(ws)])
                         for i in range(calls)])
        pdl = use_pdl(w0.device)
        us_no_pdl = None
        if pdl:
            with env_setting("VLLM_PRISM_PDL", "0"):
                us_no_pdl = round(time_graph([lambda i=i: dispatch.pq2_linear(x, ws[i % len(ws)])
                                              for i in range(calls)]), 2)
        act = kernel.make_activation(x, w0)
        us_kernel = time_graph([lambda i=i: kernel.run(act, ws[i % len(ws)], None, x.dtype)
                                for i in range(calls)])
        us_bf16 = time_graph([lambda i=i: F.linear(x, dense[i % len(dense)])
                              for i in range(max(len(dense), 20))])
        if m == 1:
            t1 = us
        cands = {}
        for name in candidates(m) if only is None else only:
            try:
                fn = candidate_fn(name)
                cands[name] = round(time_graph([lambda i=i: fn(x, ws[i % len(ws)])
                                                for i in range(calls)]), 2)
            except Exception as e:  # report and go on
                cands[name] = f"{type(e).__name__}: {e}"[:200]
        nbytes = op_bytes(m, n, k, w0.nbytes)
        rec = {
            "shape": shape, "M": m, "kernel": kernel.name, "us": round(us, 2),
            "us_kernel_only": round(us_kernel, 2), "bytes": nbytes, "pdl": pdl,
            "us_no_pdl": us_no_pdl,
            "bw_frac": round(nbytes / (us * 1e-6) / (read_gbps * 1e9), 3),
            "bf16_us": round(us_bf16, 2), "vs_bf16": round(us_bf16 / us, 3),
            "vs_m1": round(us / t1, 3) if t1 else None,
            "tflops": round(2 * m * n * k / (us * 1e-6) / 1e12, 1), "rel_err": round(err, 5),
            "candidates_us": cands,
        }
        records.append(rec)
        print(json.dumps(rec), flush=True)
    ws = dense = wd = wf = None
    torch.cuda.empty_cache()


def candidates(m: int) -> list[str]:
    """Other kernels timed at this M (end to end, producer included)."""
    small = ["mma_small_cuda", "mma_small_pipe_cuda", "mma_stream_cuda", "mma_stream_cuda:3",
             "mma_bulk_cuda", "mma_persist_cuda"] + (["mma_lean_cuda"] if m <= 8 else [])
    if m == 1:
        return ["gemv_a8", "gemv_a16", "gemv_cuda", "gemv_fused_cuda", "mma_cuda", *small]
    if m <= 8:
        gemv = ["gemv_cuda"] if m <= dispatch.GEMV_CUDA_MAX_M else []
        return ["gemv_a8_rows", *gemv, "mma_a8", "mma_a16", "mma_cuda", *small]
    if m <= 16:
        return ["mma_a8", "mma_a16", "mma_cuda", *small]
    if m <= 64:
        return ["mma_a8", "mma_a16", "mma_cuda"]
    return ["gemm_a8", "gemm_a16", "mma_cuda"] + (["gemm_dq"] if m >= dispatch.GEMM_DQ_MIN_M
                                                  else [])


def candidate_fn(name: str) -> Callable[[torch.Tensor, PQ2Weight], torch.Tensor]:
    if name == "gemv_a8_rows":  # the dp4a GEMV with all rows in one program tile
        kern = dispatch._BY_NAME["gemv_a8"]
        return lambda x, w: gemv_a8(kern.make_activation(x, w), w)
    if ":" in name:  # "<kernel>:<op variant>" of the small-batch op family (mma_small.cuh)
        base, variant = name.split(":")
        kern = dispatch._BY_NAME[base].with_variant(int(variant))
        return candidate_fn_of(kern, name)
    return candidate_fn_of(dispatch._BY_NAME[name], name)


def candidate_fn_of(kern: type, name: str) -> Callable[[torch.Tensor, PQ2Weight], torch.Tensor]:
    # is_supported loads vllm_prism._C for the CUDA C++ kernels (their ops live there)
    ok, why = kern.is_supported(torch.cuda.get_device_capability())
    if not ok:
        raise RuntimeError(f"{name} cannot run here: {why}")
    return lambda x, w: kern.run(kern.make_activation(x, w), w, None, x.dtype)


def merge_earlier(out_dir: Path, payload: dict) -> dict:
    """The payload with the earlier run's records of (shape, M) pairs this run did not
    measure (a run with --shapes / --m refreshes only its own rows); each record keeps the
    date, command and read bandwidth of its run."""
    path = out_dir / f"pq2_linear_{payload['gpu']}.json"
    if not path.is_file():
        return payload
    old = json.loads(path.read_text())
    mine = {(r["shape"], r["M"]) for r in payload["records"]}
    kept = [{"date": old.get("date"), "command": old.get("command"),
             "read_gbps": old.get("read_gbps"), **r}
            for r in old.get("records", []) if (r["shape"], r["M"]) not in mine]
    return {**payload, "records": kept + payload["records"]}


def write_results(out_dir: Path, payload: dict) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    payload = merge_earlier(out_dir, payload)
    stem = f"pq2_linear_{payload['gpu']}"
    (out_dir / f"{stem}.json").write_text(json.dumps(payload, indent=1) + "\n")
    lines = [f"# PQ2 linear on {payload['gpu_name']} ({payload['date']})", "",
             f"Command: `{payload['command']}`", "",
             f"Measured read bandwidth (fp32 sum of 4 GiB): {payload['read_gbps']:.0f} GB/s. "
             "Times: median per call inside CUDA graphs, weights rotated beyond 3x L2; "
             "`us` includes the Hadamard/quantize producer, `kernel` is the weight kernel alone.",
             "Rows of an earlier run (a later run measured other shapes) name its date.",
             "", "| shape | M | kernel | us | us without PDL | kernel us | bw_frac | vs_bf16 | "
             "vs_m1 | TFLOP/s | rel err | other kernels (us) | run |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in payload["records"]:
        other = ", ".join(f"{k} {v}" for k, v in r.get("candidates_us", {}).items())
        lines.append(f"| {r['shape']} | {r['M']} | {r['kernel']} | {r['us']} | "
                     f"{r.get('us_no_pdl') or '-'} | {r['us_kernel_only']} | {r['bw_frac']} | "
                     f"{r['vs_bf16']} | {r['vs_m1']} | {r['tflops']} | {r['rel_err']} | "
                     f"{other} | {r.get('date') or payload['date']} |")
    (out_dir / f"{stem}.md").write_text("\n".join(lines) + "\n")


def print_sweep_summary(results: list[dict]) -> None:
    """Best variant per (shape, M, family), one line each."""
    best: dict[tuple, dict] = {}
    for r in results:
        if "shape" not in r or "us" not in r or r.get("ok") is False:
            continue
        key = (r["shape"], r["M"], r["family"])
        if key not in best or r["us"] < best[key]["us"]:
            best[key] = r
    for (shape, m, fam), r in sorted(best.items()):
        print(f"{shape:>12} M={m:<5} {fam:<22} {r['us']:9.2f} us  {r.get('config', '')}")
    bad = [r for r in results if r.get("ok") is False or "error" in r]
    print(f"{len(bad)} failed variants")
    for r in bad[:20]:
        print("FAILED", r)


def parse_shape(text: str) -> tuple[int, int]:
    """``"12288x5120"`` -> (12288, 5120): N output rows by K inputs (K a multiple of the
    benchmark's Hadamard block)."""
    try:
        n, k = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise SystemExit(f"--shapes: {text!r} is not NxK (e.g. 12288x5120)") from None
    if n <= 0 or k <= 0 or k % HADAMARD_BLOCK:
        raise SystemExit(f"--shapes: {text!r} needs N > 0 and K a positive multiple of "
                         f"{HADAMARD_BLOCK} (the benchmark's Hadamard block)")
    return n, k


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sweep", action="store_true", help="time every tile variant")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--shapes", default="",
                    help="comma list of NxK like 12288x5120,16896x5120 (default: the Bonsai "
                         "shapes)")
    ap.add_argument("--m", default="", help="comma list of M (default: all)")
    ap.add_argument("--candidates", default="",
                    help="comma list of the other kernels to time (default: those of each M)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_pq2_linear.py needs a CUDA GPU")
    shapes = SHAPES
    if args.shapes:  # any NxK, in the order given
        shapes = [parse_shape(v) for v in args.shapes.split(",")]
    m_sel = [int(v) for v in args.m.split(",")] if args.m else None
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    out = Path(args.out)
    t0 = time.time()
    if args.sweep:
        results: list[dict] = [{"family": "read_gbps", "us": read_bandwidth_gbps()}]
        for n, k in shapes:
            sweep_shape(n, k, gen, results, set(m_sel) if m_sel else None)
            out.mkdir(parents=True, exist_ok=True)
            (out / "sweep.json").write_text(json.dumps(results) + "\n")
        print_sweep_summary(results)
        print(f"sweep done in {time.time() - t0:.0f} s")
        return
    read_gbps = read_bandwidth_gbps()
    print(f"read bandwidth {read_gbps:.0f} GB/s", flush=True)
    records: list[dict] = []
    payload = {
        "gpu": gpu_slug(), "gpu_name": torch.cuda.get_device_name(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python " + " ".join([os.path.relpath(__file__, ROOT), *sys.argv[1:]]),
        "torch": torch.__version__, "read_gbps": round(read_gbps, 1), "records": records,
    }
    for n, k in shapes:
        bench_shape(n, k, m_sel or M_LIST, gen, read_gbps, records,
                    args.candidates.split(",") if args.candidates else None)
        write_results(out, payload)
    print(f"benchmark done in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
