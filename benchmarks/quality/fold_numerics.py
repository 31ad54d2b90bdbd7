"""The numerics of the PQ2 kernels' activation and weight-scale roundings, emulated on the CPU
against the exact product: how far ``wgmma_fold`` (the prefill GEMM with the weight scales
folded into int8 weights, csrc/pq2/wgmma_fold.cuh) lies from ``W_st @ x``, at its two scale
resolutions (L = 63 for codes that may hold a 3, 127 for ternary codes), next to the int8
activation every decode and small-batch kernel uses and the automatic prefill's ``gemm_dq``.

Every path is written out from its rule in float64 (no kernel runs): the GPU tests check that
each kernel computes its rule (tests/kernels/test_pq2_wgmma_prefill.py), this says what the
rules cost in accuracy.

- ``int8/128``: the activation int8 per token and 128-group (scale max|x| / 127, round half
  away from zero): ``gemv_cuda``, ``mma_lean_cuda``, ``mma_cuda``, ``wgmma_cuda``;
- ``gemm_dq``: the weight dequantized to bf16 (each ``(c - 1) * d`` rounded), the bf16
  activation;
- ``fold L``: the activation int8 per token and 1024-block, each row's group scales d in a
  1024-block as D * q with D = max |d| / L, q = rint(d / D); ``fold L, weights only`` keeps
  the exact activation (the scales' share of the error).

Weights: ternary codes (a third zeros, as in the real file), fp16 group scales drawn three
ways: ``wide`` (independent per group over two octaves, the wgmma sweep's fill_scales),
``narrow`` (within +-12.5 % of a row's scale, its fill_narrow_scales), ``shaped`` (within
+-25 %: the tiny model's and the 27B-shaped file's, vllm_prism/gguf/tiny.py) and ``lognormal``
(sigma 0.3 about a row's scale). Activations: Gaussian (a rotated activation's shape) with
per-token magnitudes over two decades, rounded to bf16. Error: ||y - y_exact|| / ||y_exact||
over the whole output.

    python benchmarks/quality/fold_numerics.py [--rows 512] [--tokens 64] [--k 5120]
        [--seed 0] [--out DIR]
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
from pathlib import Path

import torch

from vllm_prism.kernels.pq2.hadamard import quantize_int8_groups

GROUP = 128
BLOCK = 1024
SCENARIOS = ("wide", "narrow", "shaped", "lognormal")


def quantize_int8(x: torch.Tensor, width: int) -> torch.Tensor:
    """x [M, K] through int8 per row and ``width`` values (the producers' rule), dequantized;
    a last piece narrower than ``width`` is one of its own (zeros padded: max|x| unchanged)."""
    k = x.shape[-1]
    xp = torch.nn.functional.pad(x, (0, -k % width))
    q, amax = quantize_int8_groups(xp, width)
    return (q.to(x.dtype) * (amax / 127.0).unsqueeze(-1)).reshape(xp.shape)[:, :k]


def fold_scales(d: torch.Tensor, levels: int) -> torch.Tensor:
    """Group scales d [N, G] as the fold kernel uses them: D * rint(d / D) a 1024-block (the
    last block partial where G is not a multiple of 8, as the kernel's)."""
    n, g = d.shape
    per = BLOCK // GROUP
    db = torch.nn.functional.pad(d, (0, -g % per)).reshape(n, -1, per)
    mx = db.abs().amax(dim=2, keepdim=True)
    inv = torch.where(mx > 0, levels / mx, torch.zeros_like(mx))
    q = torch.round(db * inv)
    dw = torch.where(inv > 0, 1.0 / inv, torch.zeros_like(inv))
    return (dw * q).reshape(n, -1)[:, :g]


def group_scales(kind: str, n: int, g: int, gen: torch.Generator) -> torch.Tensor:
    """fp16 group scales [N, G] (as float64) of one scenario."""
    row = torch.exp(torch.randn(n, 1, generator=gen, dtype=torch.float64) * 0.5) * 0.01
    u = torch.rand(n, g, generator=gen, dtype=torch.float64)
    if kind == "wide":
        octave = torch.randint(0, 3, (n, g), generator=gen).to(torch.float64)
        d = (1.0 + u) * torch.exp2(-9.0 + octave)
    elif kind == "narrow":
        d = row * (0.875 + 0.25 * u)
    elif kind == "shaped":  # the tiny model's and the 27B-shaped file's (vllm_prism.gguf.tiny)
        d = row * (0.75 + 0.5 * u)
    elif kind == "lognormal":
        d = row * torch.exp(torch.randn(n, g, generator=gen, dtype=torch.float64) * 0.3)
    else:
        raise ValueError(f"unknown scale scenario {kind!r}; choose from {SCENARIOS}")
    return d.to(torch.float16).to(torch.float64)


def case(kind: str, n: int, m: int, k: int, seed: int) -> dict[str, float]:
    """Relative errors of every path on one random case."""
    gen = torch.Generator().manual_seed(seed)
    c = torch.randint(-1, 2, (n, k), generator=gen).to(torch.float64)
    d = group_scales(kind, n, k // GROUP, gen)
    tok = torch.exp(torch.randn(m, 1, generator=gen, dtype=torch.float64) * 1.15)
    x = (torch.randn(m, k, generator=gen, dtype=torch.float64) * tok)
    x = x.to(torch.bfloat16).to(torch.float64)

    def weights(scales: torch.Tensor) -> torch.Tensor:
        return c * scales.repeat_interleave(GROUP, dim=1)

    w = weights(d)
    y = x @ w.T
    norm = torch.linalg.norm(y)

    def err(yy: torch.Tensor) -> float:
        return float(torch.linalg.norm(yy - y) / norm)

    out = {"int8/128": err(quantize_int8(x, GROUP) @ w.T),
           "gemm_dq": err(x @ w.to(torch.bfloat16).to(torch.float64).T)}
    xb = quantize_int8(x, BLOCK)
    for levels in (63, 127):
        wf = weights(fold_scales(d, levels))
        out[f"fold {levels}"] = err(xb @ wf.T)
        out[f"fold {levels}, weights only"] = err(x @ wf.T)
    out["int8/1024, activation only"] = err(xb @ w.T)
    return out


def markdown(rows: list[dict], cmd: str, date: str) -> str:
    paths = list(rows[0]["errors"])
    lines = [f"# PQ2 kernel numerics emulated on the CPU ({date})", "",
             f"`{cmd}` on {platform.processor() or platform.machine()} (no GPU: every path "
             "written out from its rule in float64). Relative error of the whole output against "
             "the exact product, in %; `x int8/128`: the same over the int8/128 activation's "
             "error (the decode and small-batch kernels' own).", "",
             "| scales | " + " | ".join(paths) + " | fold 63 x int8/128 | fold 127 x int8/128 |",
             "|---" * (len(paths) + 3) + "|"]
    for r in rows:
        e = r["errors"]
        base = e["int8/128"]
        cells = [f"{100 * e[p]:.3f}" for p in paths]
        lines.append(f"| {r['scales']} | " + " | ".join(cells)
                     + f" | {e['fold 63'] / base:.2f} | {e['fold 127'] / base:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=512)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--k", type=int, default=5120, help="a multiple of 1024")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None,
                    help="write fold_numerics_cpu.{md,json} here")
    args = ap.parse_args(argv)
    if args.k % BLOCK:
        ap.error(f"--k {args.k} is not a multiple of {BLOCK}")
    cmd = "python benchmarks/quality/fold_numerics.py " + " ".join(argv or sys.argv[1:])
    date = datetime.date.today().isoformat()
    rows = [{"scales": kind, "errors": case(kind, args.rows, args.tokens, args.k, args.seed + i)}
            for i, kind in enumerate(SCENARIOS)]
    text = markdown(rows, cmd.strip(), date)
    sys.stdout.write(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "fold_numerics_cpu.md").write_text(text)
        record = {"date": date, "command": cmd.strip(), "rows": args.rows,
                  "tokens": args.tokens, "k": args.k, "results": rows}
        (args.out / "fold_numerics_cpu.json").write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
