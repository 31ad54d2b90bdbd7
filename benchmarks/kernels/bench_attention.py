"""Benchmark of the prism attention kernels (vllm_prism.attention.ops) on a CUDA GPU.

Shape: Bonsai 2 27B full-attention layer (24 query heads, 4 KV heads, head dim 256), one
request, vLLM's NHD paged cache with block size 16 and a shuffled block table.

* decode (1 query token) and verify (k+1 = 4, 6, 8 query tokens) at 4K, 32K, 64K, 128K context,
  for the INT8 (``int8_per_token_head``) and BF16 caches: microseconds per layer, share of the
  read bandwidth measured in the same run (bytes = K+V rows and scales of every context token),
  ratio to torch SDPA (flash) on contiguous BF16 K/V of the same shape (``vs_sdpa`` = SDPA time
  / ours), and for verify the ratio to decode at the same context (``vs_decode``). The CUDA
  C++ kernels' variants follow their default rows (``vs_default``): bf16 and fp16 partials,
  the other dim_split, the decode kernel's other copies (``cuda bulk copy``: a bulk-copy
  request a tile, or ``cuda cp.async copy``; compute capability 9.0), the other maxima form
  and, where it can run (sm_90a build, compute capability 9.0), the verification kernel's
  warpgroup-MMA forms (``cuda wgmma``, its producer on cp.async, ``cuda wgmma tma``, on a
  TMA tensor map over the cache, and ``cuda wgmma tma bf16`` / ``fp16``, its partials in bf16
  / fp16; with ``vs_decode``).
  The ``cuda`` verification rows are its mma form (int8_verify.cu), whatever the library's
  default (``auto``: ``cuda wgmma tma`` where it can serve the call).
* noncausal: a DFlash drafter's 6-token block against the whole context (no mask), split,
  and with one segment (``one_segment_us``: one program per KV head over the whole context,
  the launch vLLM's ``unified_attention`` makes for any step of more than one query token).
* prefill: a 2048-token chunk at context 0 and 32K, tokens/s against SDPA flash on contiguous
  BF16 K/V (causal at context 0, plain over all keys at 32K).

Timing: CUDA events around replays of a CUDA graph of many calls, each call on a different
part of the cache (enough to exceed 3x the L2, so every call streams from device memory);
median replay / calls. Prefill is timed eagerly (its section loop runs on the host).

``--sweep`` first times the geometry variants in ``SWEEP`` at 32K and 128K (each checked
against the fp32 reference; ``--deadline`` bounds it), picks per (kind, cache dtype) the one
with the lowest sum of time / best time, and runs the records with those (each record names
its geometry); without it the records use the GPU's entry in
``vllm_prism.attention.ops.geometry``.

    python benchmarks/kernels/bench_attention.py                  # writes benchmarks/results/
    python benchmarks/kernels/bench_attention.py --sweep --deadline 65 --out /tmp/x
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import json
import math
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import timing  # noqa: E402
from vllm_prism.attention.ops import (AttentionMetadata, SplitGeometry,  # noqa: E402
                                      cuda_decode, decode_attention, gpu_geometry,
                                      make_kv_cache, noncausal_attention, prefill_attention,
                                      reference_attention, verify_attention)
from vllm_prism.attention.ops.layout import kv_format  # noqa: E402
from vllm_prism.attention.ops.triton_split_kv import _merge  # noqa: E402
from vllm_prism.kernels.common import sm_count  # noqa: E402

DEVICE = "cuda"
HQ, HKV, HS = 24, 4, 256
CONTEXTS = [4096, 32768, 65536, 131072]
VERIFY_Q = [4, 6, 8]
PREFILL_CONTEXTS = (0, 32768)
# the CUDA kernels' half-size partial outputs (cuda_decode.PARTIALS_DTYPE) the variant rows
# time beside the default fp32
HALF_PARTIALS = {"bf16": torch.bfloat16, "fp16": torch.float16}
L2_MULTIPLE = 3
T0 = time.time()


def gpu_slug() -> str:
    return "cpu-smoke" if DEVICE == "cpu" else timing.gpu_slug()


def _cpu_us(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1e6


def time_graph(calls: list[Callable[[], object]], replays: int = 10) -> float:
    """Median microseconds per call of a CUDA graph replaying ``calls`` in order."""
    if DEVICE == "cpu":  # smoke test of the script under the Triton interpreter
        return _cpu_us(calls[0])
    return timing.time_graph(calls, replays, warm=2)


def time_eager(fn: Callable[[], object], reps: int = 5) -> float:
    return _cpu_us(fn) if DEVICE == "cpu" else timing.time_eager(fn, reps)


def read_bandwidth_gbps() -> float:
    return 1.0 if DEVICE == "cpu" else timing.read_bandwidth_gbps(DEVICE)


def l2_bytes() -> int:
    return 1 << 16 if DEVICE == "cpu" else timing.l2_bytes()


class Cache:
    """One big random cache; ``copies`` requests of ``ctx`` tokens on disjoint blocks."""

    def __init__(self, dtype: torch.dtype, block_size: int, max_ctx: int):
        self.dtype = dtype
        self.bs = block_size
        tok_bytes = HKV * 2 * (HS + 4) if dtype == torch.int8 else HKV * 2 * HS * 2
        self.tok_bytes = tok_bytes
        need = max(max_ctx, L2_MULTIPLE * l2_bytes() // tok_bytes + 4 * block_size)
        self.num_blocks = -(-need // block_size) + 8
        self.cache = make_kv_cache(self.num_blocks, HKV, block_size, HS, dtype, "NHD", DEVICE,
                                   fill="random")
        assert kv_format(self.cache).bytes_per_token == tok_bytes
        g = torch.Generator().manual_seed(1)
        self.perm = torch.randperm(self.num_blocks, generator=g).to(torch.int32)

    def copies(self, ctx: int) -> int:
        return max(1, min(64, math.ceil(L2_MULTIPLE * l2_bytes() / (ctx * self.tok_bytes))))

    def metadata(self, ctx: int, q_len: int, copy: int) -> AttentionMetadata:
        nb = -(-ctx // self.bs)
        start = (copy * nb) % max(1, self.num_blocks - nb)
        bt = self.perm[start:start + nb].unsqueeze(0).to(DEVICE)
        return AttentionMetadata.build(bt, [ctx], [q_len])


def sdpa_calls(ctx: int, q_len: int, copies: int, causal: bool = False):
    qs = torch.randn(1, HQ, q_len, HS, device=DEVICE, dtype=torch.bfloat16)
    kvs = [(torch.randn(1, HKV, ctx, HS, device=DEVICE, dtype=torch.bfloat16),
            torch.randn(1, HKV, ctx, HS, device=DEVICE, dtype=torch.bfloat16))
           for _ in range(copies)]

    def make(i):
        k, v = kvs[i]
        return lambda: F.scaled_dot_product_attention(qs, k, v, is_causal=causal,
                                                      enable_gqa=True)
    return [make(i) for i in range(copies)], kvs


def sdpa_time(ctx: int, q_len: int, causal: bool = False) -> tuple[float, str]:
    bytes_kv = ctx * HKV * HS * 2 * 2
    copies = max(1, min(64, math.ceil(L2_MULTIPLE * l2_bytes() / bytes_kv)))
    calls, kvs = sdpa_calls(ctx, q_len, copies, causal)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    try:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            us = time_graph(calls * max(1, 20 // copies))
        backend = "flash"
    except Exception:  # noqa: BLE001
        us = time_graph(calls * max(1, 20 // copies))
        backend = "default"
    del kvs
    torch.cuda.empty_cache()
    return us, backend


def ours_time(cache: Cache, ctx: int, q_len: int, geometry: SplitGeometry | None = None,
              int_qk: bool = False, check: bool = False, kernel: str = "triton",
              causal: bool = True, num_segs: int | None = None):
    """Microseconds per call of ``kernel`` (``triton`` or ``cuda``: the CUDA C++ INT8 decode or
    verification kernel; ``int_qk``: Q.K on the int8 tensor cores); with ``check``, also the
    relative error of the first call's output against the fp32 reference. ``causal=False``: a
    DFlash drafter's non-causal block (``noncausal_attention``, ``num_segs`` segments or the
    geometry's)."""
    copies = cache.copies(ctx)
    q = torch.randn(q_len, HQ, HS, device=DEVICE, dtype=torch.bfloat16)
    outs = [torch.empty_like(q) for _ in range(copies)]
    mds = [cache.metadata(ctx, q_len, i) for i in range(copies)]
    if not causal:
        calls = [lambda i=i: noncausal_attention(q, cache.cache, mds[i], out=outs[i],
                                                 geometry=geometry, num_segs=num_segs)
                 for i in range(copies)]
    elif q_len == 1:
        calls = [lambda i=i: decode_attention(q, cache.cache, mds[i], out=outs[i],
                                              geometry=geometry, int_qk=int_qk,
                                              kernel=kernel)
                 for i in range(copies)]
    else:
        calls = [lambda i=i: verify_attention(q, cache.cache, mds[i], out=outs[i],
                                              geometry=geometry, int_qk=int_qk,
                                              kernel=kernel)
                 for i in range(copies)]
    us = time_graph(calls * max(1, 20 // copies))
    if not check:
        return us
    md = mds[0]
    ref = reference_attention(q, cache.cache, md.block_table, md.seq_lens_cpu,
                              md.query_start_loc_cpu, causal=causal)
    err = ((outs[0].float() - ref).norm() / ref.norm()).item()
    return us, err


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--sweep", action="store_true", help="also time geometry variants")
    ap.add_argument("--deadline", type=float, default=1e9, help="seconds; skip work after it")
    ap.add_argument("--cuda-sweep", action="store_true",
                    help="first time the CUDA C++ INT8 decode kernel's segmentation variants "
                    "(CTAs per SM x minimum tiles per segment, CUDA_SWEEP) and the "
                    "verification kernel's segment counts (VERIFY_SWEEP)")
    ap.add_argument("--cuda-decompose", action="store_true",
                    help="first time the CUDA C++ INT8 decode call's parts at each context: "
                    "the decode kernel alone, the merge alone, the whole call, and the same "
                    "grid over a one-token context (the call's floor)")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--contexts", default=",".join(map(str, CONTEXTS)))
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="run the script on the CPU (TRITON_INTERPRET=1) with tiny shapes")
    args = ap.parse_args()
    if args.cpu_smoke:
        global DEVICE, VERIFY_Q, PREFILL_CONTEXTS
        DEVICE = "cpu"
        VERIFY_Q = [4]
        PREFILL_CONTEXTS = (0, 64)
        args.contexts = "64,130"
    contexts = [int(c) for c in args.contexts.split(",")]
    cuda_decode.VERIFY_FORM = "mma"  # the "cuda" rows; the other forms are variant rows
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    gpu = gpu_slug()
    res = {"gpu": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu",
           "date": datetime.date.today().isoformat(),
           "command": "python " + " ".join(sys.argv), "torch": torch.__version__,
           "block_size": args.block_size, "shape": {"q_heads": HQ, "kv_heads": HKV,
                                                    "head_size": HS},
           "geometry": {k: g.short()
                        for k, g in vars(gpu_geometry(torch.device(DEVICE))).items()},
           "read_gbps": None, "records": [], "sweep": [], "cuda_sweep": [],
           "cuda_decompose": [], "errors": []}

    def save():
        (out_dir / f"attention_{gpu}.json").write_text(json.dumps(res, indent=1))
        (out_dir / f"attention_{gpu}.md").write_text(markdown(res))

    def late() -> bool:
        return time.time() - T0 > args.deadline

    res["read_gbps"] = read_bw = read_bandwidth_gbps()
    print(f"read bandwidth {read_bw:.0f} GB/s", flush=True)
    sdpa_cache: dict[tuple[int, int, bool], tuple[float, str]] = {}

    def sdpa(ctx, ql, causal=False):
        key = (ctx, ql, causal)
        if key not in sdpa_cache:
            sdpa_cache[key] = sdpa_time(ctx, ql, causal)
        return sdpa_cache[key]

    if args.cuda_sweep and DEVICE == "cuda":
        cache = Cache(torch.int8, args.block_size, 131072)
        if cuda_ready(cache):
            run_cuda_sweep(cache, res, late, read_bw, save)
        del cache
        torch.cuda.empty_cache()
    if args.cuda_decompose and DEVICE == "cuda":
        cache = Cache(torch.int8, args.block_size, max(contexts))
        if cuda_ready(cache):
            run_cuda_decompose(cache, contexts, res, late, read_bw, save)
        del cache
        torch.cuda.empty_cache()
    best: dict[tuple[str, str], SplitGeometry] = {}
    if args.sweep:  # first (bounded by --deadline); the records below use the winners
        for kv_name, dtype in (("int8", torch.int8), ("bf16", torch.bfloat16)):
            if late():
                break
            cache = Cache(dtype, args.block_size, 131072 if DEVICE == "cuda" else 130)
            sweep(cache, kv_name, res, late, read_bw, save)
            del cache
            torch.cuda.empty_cache()
        best = pick_best(res)
        res["picked"] = {f"{k[0]}_{k[1]}": g.short() for k, g in best.items()}
        print("picked", json.dumps(res["picked"]), flush=True)
    default = gpu_geometry(torch.device(DEVICE))

    def geom(kind: str, kv: str) -> SplitGeometry:
        return best.get((kind, kv)) or default.pick(kind == "verify", kv == "int8")

    for kv_name, dtype in (("int8", torch.int8), ("bf16", torch.bfloat16)):
        cache = Cache(dtype, args.block_size, max(contexts))
        for ctx in contexts:
            try:
                bytes_ = ctx * cache.tok_bytes
                dec = triton_dec = ours_time(cache, ctx, 1, geometry=geom("decode", kv_name))
                s_us, backend = sdpa(ctx, 1)
                rec = dict(kind="decode", kernel="triton", context=ctx, q_tokens=1, kv=kv_name,
                           us=round(dec, 2), geometry=geom("decode", kv_name).short(),
                           bw_frac=round(bytes_ / (dec * 1e-6) / 1e9 / read_bw, 3),
                           vs_sdpa=round(s_us / dec, 3), sdpa_us=round(s_us, 2),
                           sdpa_backend=backend)
                res["records"].append(rec)
                print(json.dumps(rec), flush=True)
                if kv_name == "int8" and cuda_ready(cache):
                    # the CUDA C++ kernel, what decode runs on an INT8 cache by default
                    dec, err = ours_time(cache, ctx, 1, check=True, kernel="cuda")
                    split = cuda_decode.decode_dim_split(cuda_decode.attention_pdl(
                        torch.device(DEVICE)))
                    rec = dict(kind="decode", kernel="cuda", context=ctx, q_tokens=1,
                               kv=kv_name, us=round(dec, 2), dim_split=split,
                               bw_frac=round(bytes_ / (dec * 1e-6) / 1e9 / read_bw, 3),
                               vs_sdpa=round(s_us / dec, 3), vs_triton=round(triton_dec / dec, 3),
                               sdpa_us=round(s_us, 2), err=float(f"{err:.3g}"))
                    res["records"].append(rec)
                    print(json.dumps(rec), flush=True)
                    # the kernel's other form (one warp a (tile, head), or two), and bf16
                    # and fp16 partials
                    other = 3 - split
                    for rec in (cuda_variant_record(cache, ctx, 1, dec, bytes_, read_bw,
                                                    f"cuda dim_split={other}",
                                                    {"DECODE_DIM_SPLIT": other},
                                                    dict(dim_split=other,
                                                         sdpa_us=round(s_us, 2)),
                                                    s_us, triton_dec),
                                *(cuda_variant_record(cache, ctx, 1, dec, bytes_, read_bw,
                                                      f"cuda {name} partials",
                                                      {"PARTIALS_DTYPE": dtype})
                                  for name, dtype in HALF_PARTIALS.items())):
                        res["records"].append(rec)
                        print(json.dumps(rec), flush=True)
                    # the tiles on the bulk-copy engine (sm_90+), against the default copies
                    other_copy = ("bulk" if cuda_decode.decode_copy(torch.device(DEVICE))
                                  == "cp_async" else "cp_async")
                    if DEVICE == "cuda" and torch.cuda.get_device_capability() >= (9, 0):
                        rec = cuda_variant_record(cache, ctx, 1, dec, bytes_, read_bw,
                                                  f"cuda {other_copy.replace('_', '.')} copy",
                                                  {"DECODE_COPY": other_copy},
                                                  dict(copy=other_copy,
                                                       sdpa_us=round(s_us, 2)),
                                                  s_us, triton_dec)
                        res["records"].append(rec)
                        print(json.dumps(rec), flush=True)
                for ql in VERIFY_Q:
                    us = ours_time(cache, ctx, ql, geometry=geom("verify", kv_name))
                    s_us, backend = sdpa(ctx, ql)
                    rec = dict(kind="verify", kernel="triton", context=ctx, q_tokens=ql,
                               kv=kv_name,
                               us=round(us, 2), geometry=geom("verify", kv_name).short(),
                               bw_frac=round(bytes_ / (us * 1e-6) / 1e9 / read_bw, 3),
                               vs_sdpa=round(s_us / us, 3), vs_decode=round(us / dec, 3),
                               sdpa_us=round(s_us, 2), sdpa_backend=backend)
                    res["records"].append(rec)
                    print(json.dumps(rec), flush=True)
                    if kv_name == "int8" and cuda_ready(cache, ql):
                        triton_us = us
                        us, err = ours_time(cache, ctx, ql, check=True, kernel="cuda")
                        rec = dict(kind="verify", kernel="cuda", context=ctx, q_tokens=ql,
                                   kv=kv_name, us=round(us, 2),
                                   bw_frac=round(bytes_ / (us * 1e-6) / 1e9 / read_bw, 3),
                                   vs_sdpa=round(s_us / us, 3), vs_decode=round(us / dec, 3),
                                   vs_triton=round(triton_us / us, 3), sdpa_us=round(s_us, 2),
                                   err=float(f"{err:.3g}"))
                        res["records"].append(rec)
                        print(json.dumps(rec), flush=True)
                        other = 3 - cuda_decode.VERIFY_DIM_SPLIT
                        lazy = cuda_decode.verify_lazy_max()
                        for rec in (*(cuda_variant_record(cache, ctx, ql, us, bytes_, read_bw,
                                                          f"cuda {name} partials",
                                                          {"PARTIALS_DTYPE": dtype})
                                      for name, dtype in HALF_PARTIALS.items()),
                                    cuda_variant_record(cache, ctx, ql, us, bytes_, read_bw,
                                                        f"cuda dim_split={other}",
                                                        {"VERIFY_DIM_SPLIT": other},
                                                        dict(dim_split=other)),
                                    cuda_variant_record(cache, ctx, ql, us, bytes_, read_bw,
                                                        "cuda lazy max" if not lazy
                                                        else "cuda exact max",
                                                        {"VERIFY_LAZY_MAX": not lazy})):
                            res["records"].append(rec)
                            print(json.dumps(rec), flush=True)
                        # the warpgroup-MMA forms (opt-in: its producer on cp.async, or on a
                        # TMA tensor map), against the default
                        # (and the TMA form with bf16 and fp16 partials)
                        forms = [("wgmma", "", torch.float32), ("wgmma_tma", "", torch.float32)]
                        forms += [("wgmma_tma", f" {name}", dtype)
                                  for name, dtype in HALF_PARTIALS.items()]
                        for form, suffix, dtype in forms if wgmma_ready() else ():
                            rec = cuda_variant_record(
                                cache, ctx, ql, us, bytes_, read_bw,
                                f"cuda {form.replace('_', ' ')}{suffix}",
                                {"VERIFY_FORM": form, "PARTIALS_DTYPE": dtype},
                                dict(form=form))
                            rec["vs_decode"] = round(rec["us"] / dec, 3)
                            res["records"].append(rec)
                            print(json.dumps(rec), flush=True)
                        # the same kernel with Q.K on the int8 tensor cores (opt-in)
                        exact_us = us
                        us, err = ours_time(cache, ctx, ql, check=True, kernel="cuda",
                                            int_qk=True)
                        rec = dict(kind="verify_int_qk", kernel="cuda", context=ctx,
                                   q_tokens=ql, kv=kv_name, us=round(us, 2),
                                   bw_frac=round(bytes_ / (us * 1e-6) / 1e9 / read_bw, 3),
                                   vs_decode=round(us / dec, 3),
                                   vs_exact=round(exact_us / us, 3), err=float(f"{err:.3g}"))
                        res["records"].append(rec)
                        print(json.dumps(rec), flush=True)
                # a DFlash drafter's non-causal 6-token block, split, against the same kernel
                # with one segment: one program per KV head walking the whole context, as
                # vLLM's unified_attention launches any step with more than one query token
                us, err = ours_time(cache, ctx, 6, geometry=geom("verify", kv_name),
                                    check=True, causal=False)
                one = ours_time(cache, ctx, 6, geometry=geom("verify", kv_name), causal=False,
                                num_segs=1)
                rec = dict(kind="noncausal", kernel="triton", context=ctx, q_tokens=6,
                           kv=kv_name, us=round(us, 2), one_segment_us=round(one, 2),
                           vs_one_segment=round(one / us, 3),
                           bw_frac=round(bytes_ / (us * 1e-6) / 1e9 / read_bw, 3),
                           vs_decode=round(us / dec, 3), err=float(f"{err:.3g}"))
                res["records"].append(rec)
                print(json.dumps(rec), flush=True)
                if kv_name == "int8":
                    us = ours_time(cache, ctx, 1, geometry=geom("decode", kv_name),
                                   int_qk=True)
                    rec = dict(kind="decode_int_qk", kernel="triton", context=ctx, q_tokens=1,
                               kv=kv_name,
                               us=round(us, 2),
                               bw_frac=round(bytes_ / (us * 1e-6) / 1e9 / read_bw, 3),
                               vs_decode=round(us / triton_dec, 3))
                    res["records"].append(rec)
                    print(json.dumps(rec), flush=True)
            except Exception:  # noqa: BLE001 - keep going, report
                res["errors"].append(f"{kv_name} ctx {ctx}: {traceback.format_exc()[-1500:]}")
                print(res["errors"][-1], flush=True)
            save()
        # prefill: a 2048-token chunk at context 0 and 32K
        for ctx in PREFILL_CONTEXTS:
            try:
                chunk = 2048 if DEVICE == "cuda" else 40
                total = ctx + chunk
                md = cache.metadata(total, chunk, 0)
                q = torch.randn(chunk, HQ, HS, device=DEVICE, dtype=torch.bfloat16)
                out = torch.empty_like(q)
                scratch = torch.empty(2, min(32768, total), HKV, HS, dtype=torch.bfloat16,
                                      device=DEVICE)
                kv_cache = cache.cache  # bound here: the lambda must not see a later `del`
                us = time_eager(lambda: prefill_attention(q, kv_cache, md, out=out,
                                                          scratch=scratch))
                qs = q.transpose(0, 1).unsqueeze(0)
                k = torch.randn(1, HKV, total, HS, device=DEVICE, dtype=torch.bfloat16)
                v = torch.randn_like(k)
                from torch.nn.attention import SDPBackend, sdpa_kernel
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    s_us = time_eager(lambda k=k, v=v: F.scaled_dot_product_attention(
                        qs, k, v, is_causal=(ctx == 0), enable_gqa=True))
                del k, v
                rec = dict(kind="prefill", context=ctx, q_tokens=chunk, kv=kv_name,
                           us=round(us, 1), tok_s=round(chunk / (us * 1e-6)),
                           sdpa_tok_s=round(chunk / (s_us * 1e-6)),
                           vs_sdpa=round(s_us / us, 3), sdpa_us=round(s_us, 1))
                res["records"].append(rec)
                print(json.dumps(rec), flush=True)
            except Exception:  # noqa: BLE001
                res["errors"].append(f"prefill {kv_name} ctx {ctx}: "
                                     f"{traceback.format_exc()[-1500:]}")
                print(res["errors"][-1], flush=True)
            save()
        del cache
        torch.cuda.empty_cache()
    save()
    print(markdown(res))


G = SplitGeometry  # tile, programs/SM, max segs, min tiles/seg, warps, stages, bf16 partials,
#                     hand prefetch, 64-row minimum, INT8 operands as fp16 from their bits
SWEEP = {
    ("decode", "int8"): [
        G(32, 2.0, 128, 4, 4, 1, prefetch=True), G(32, 3.0, 128, 4, 4, 1, prefetch=True),
        G(32, 4.0, 256, 4, 4, 1, prefetch=True), G(64, 2.0, 128, 2, 8, 1, prefetch=True),
        G(32, 2.0, 128, 4, 8, 1, prefetch=True), G(64, 2.0, 128, 2, 4, 3),
        G(32, 2.0, 128, 4, 4, 3, block_m_min=64), G(32, 3.0, 128, 4, 4, 3, block_m_min=64),
        G(32, 2.0, 128, 4, 8, 1, prefetch=True, block_m_min=64),
        G(64, 2.0, 128, 2, 4, 3, i8_f16=True), G(32, 2.0, 128, 4, 4, 3, i8_f16=True),
        G(32, 2.0, 128, 4, 4, 3, block_m_min=64, i8_f16=True)],
    ("verify", "int8"): [
        G(32, 2.0, 64, 4, 4, 3, True), G(32, 3.0, 128, 4, 4, 3, True),
        G(32, 4.0, 128, 4, 4, 3, True), G(32, 2.0, 64, 4, 8, 1, True, prefetch=True),
        G(32, 3.0, 128, 4, 8, 1, True, prefetch=True), G(64, 2.0, 64, 2, 8, 2, True),
        G(32, 2.0, 64, 4, 4, 3, True, i8_f16=True)],
    ("decode", "bf16"): [
        G(32, 2.0, 128, 4, 4, 3), G(32, 2.0, 128, 4, 4, 3, block_m_min=64),
        G(32, 3.0, 128, 4, 4, 3, block_m_min=64), G(32, 4.0, 128, 4, 4, 3, block_m_min=64),
        G(32, 2.0, 128, 4, 8, 1, prefetch=True, block_m_min=64),
        G(32, 2.0, 128, 4, 8, 1, prefetch=True)],
    ("verify", "bf16"): [
        G(32, 2.0, 64, 4, 4, 3, True), G(32, 3.0, 128, 4, 4, 3, True),
        G(32, 4.0, 128, 4, 4, 3, True), G(32, 2.0, 64, 4, 8, 1, True, prefetch=True),
        G(32, 3.0, 128, 4, 8, 1, True, prefetch=True)],
}


def pick_best(res: dict) -> dict[tuple[str, str], SplitGeometry]:
    """Per (kind, kv): the variant with the lowest sum of time / best time over the contexts."""
    best = {}
    for (kind, kv), variants in SWEEP.items():
        recs = [r for r in res["sweep"] if r["kind"] == kind and r["kv"] == kv and "us" in r]
        ctxs = sorted({r["context"] for r in recs})
        if not ctxs:
            continue
        low = {c: min(r["us"] for r in recs if r["context"] == c) for c in ctxs}
        scores = []
        for g in variants:
            mine = {r["context"]: r["us"] for r in recs if r["geometry"] == g.short()}
            if len(mine) == len(ctxs):
                scores.append((sum(mine[c] / low[c] for c in ctxs), g))
        if scores:
            best[(kind, kv)] = min(scores, key=lambda x: x[0])[1]
    return best


def sweep(cache: Cache, kv_name: str, res: dict, late, read_bw: float, save) -> None:
    for kind, ql in (("decode", 1), ("verify", 6)):
        variants = SWEEP[(kind, kv_name)]
        if DEVICE == "cpu":
            variants = variants[:1]
        for geom in variants:
            for ctx in ((32768, 131072) if DEVICE == "cuda" else (130,)):
                if late():
                    return
                try:
                    us, err = ours_time(cache, ctx, ql, geometry=geom, check=True,
                                        kernel="triton")
                    bw = ctx * cache.tok_bytes / (us * 1e-6) / 1e9 / read_bw
                    rec = dict(kind=kind, kv=kv_name, context=ctx, q_tokens=ql,
                               geometry=geom.short(), us=round(us, 2), bw_frac=round(bw, 3),
                               err=float(f"{err:.3g}"))
                    if not err < 1e-2:  # never pick a variant that computes the wrong thing
                        rec["error"] = f"rel err {err:.3g}"
                        del rec["us"]
                except Exception as e:  # noqa: BLE001
                    rec = dict(kind=kind, kv=kv_name, context=ctx, geometry=geom.short(),
                               error=f"{type(e).__name__}: {e}"[:300])
                res["sweep"].append(rec)
                print(json.dumps(rec), flush=True)
            save()


# (CTAs per multiprocessor, minimum 16-slot tiles per segment, warps a (tile, KV head), most
# segments) of the CUDA decode kernel: the batch-1 segment count is sms x CTAs per SM, at most
# the last (cuda_decode.MAX_SEGMENTS, 256 in the library: so on 132 SMs 3 CTAs a multiprocessor
# are 2's 256); the first is the library's default. Past two CTAs a multiprocessor the grid
# runs in waves that the block scheduler hands out as CTAs finish, each segment with its own
# partial (the CTAs' spread, docs/attention.md).
CUDA_SWEEP = [(2, 4, 2, 256), (2, 4, 1, 256), (2, 8, 2, 256), (3, 4, 2, 256), (1, 4, 2, 256),
              (2, 2, 2, 256), (4, 4, 2, 1024), (8, 4, 2, 1024)]
# The verification kernel's CTAs a multiprocessor worth of segments (cuda_decode.
# VERIFY_CTAS_PER_SM; one CTA a multiprocessor is resident, two segments a CTA): 2 is the
# library's one wave, 4 and 8 two and four waves; timed at DECOMPOSE_VERIFY_TOKENS tokens.
VERIFY_SWEEP = [2, 4, 8]


@contextlib.contextmanager
def cuda_settings(**overrides) -> Iterator[None]:
    """cuda_decode's module settings ``overrides`` (e.g. ``ATTN_PDL=False``) for the calls
    made inside, restored after."""
    saved = {name: getattr(cuda_decode, name) for name in overrides}
    for name, value in overrides.items():
        setattr(cuda_decode, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(cuda_decode, name, value)


def run_cuda_sweep(cache: Cache, res: dict, late, read_bw: float, save) -> None:
    """Time the CUDA decode kernel's segmentation variants at 4K / 32K / 128K and the
    verification kernel's segment counts at 32K / 128K (one request), each checked against the
    fp32 reference."""
    sms = sm_count(torch.device(DEVICE))

    def record(kind: str, ctx: int, q_len: int, segs: int, **variant) -> None:
        us, err = ours_time(cache, ctx, q_len, check=True, kernel="cuda")
        rec = dict(kind=kind, kernel="cuda", kv="int8", context=ctx, **variant, segments=segs,
                   us=round(us, 2),
                   bw_frac=round(ctx * cache.tok_bytes / (us * 1e-6) / 1e9 / read_bw, 3),
                   err=float(f"{err:.3g}"))
        res["cuda_sweep"].append(rec)
        print(json.dumps(rec), flush=True)

    for ctas, min_tiles, split, most in CUDA_SWEEP:
        for ctx in (4096, 32768, 131072):
            if late():
                return
            with cuda_settings(CTAS_PER_SM=ctas, MIN_TILES=min_tiles, DECODE_DIM_SPLIT=split,
                               MAX_SEGMENTS=most):
                record("decode", ctx, 1, cuda_decode.num_cuda_segments(1, sms),
                       ctas_per_sm=ctas, min_tiles=min_tiles, dim_split=split)
        save()
    for per_sm in VERIFY_SWEEP:
        for ctx in (32768, 131072):
            if late():
                return
            with cuda_settings(VERIFY_CTAS_PER_SM=per_sm):
                record("verify", ctx, DECOMPOSE_VERIFY_TOKENS,
                       cuda_decode.num_cuda_segments(1, sms, HKV, per_sm),
                       q_tokens=DECOMPOSE_VERIFY_TOKENS, ctas_per_sm=per_sm)
        save()


# The verification call --cuda-decompose times (a DFlash step of k = 5 drafts).
DECOMPOSE_VERIFY_TOKENS = 6


def decompose_calls(cache: Cache, ctx: int, part: str,
                    q_len: int = 1) -> list[Callable[[], object]]:
    """Calls (one per cache copy) of one part of the CUDA decode call at ``ctx``: ``kernel``
    (the decode kernel writing its partials), ``merge`` (the log-sum-exp merge of partials the
    kernel wrote once), both without programmatic dependent launch, or ``call pdl 0`` /
    ``call pdl 1`` / ``call pdl end`` (both, as decode_attention runs them, without it / with
    the merge let launch at the kernel's start / after its stage loop). ``q_len`` > 1: the
    verification call of that many tokens (``call`` parts only)."""
    if q_len > 1 and not part.startswith("call"):
        raise ValueError(f"the verification call has no part {part!r} here (call parts only)")
    q = torch.randn(q_len, HQ, HS, device=DEVICE, dtype=torch.bfloat16)
    copies = cache.copies(ctx)
    mds = [cache.metadata(ctx, q_len, i) for i in range(copies)]
    outs = [torch.empty_like(q) for _ in range(copies)]
    segs = cuda_decode.num_cuda_segments(1, sm_count(q.device))
    parts = [(torch.empty(1, 1, HQ, segs, HS, dtype=cuda_decode.PARTIALS_DTYPE,
                          device=DEVICE),
              torch.empty(1, 1, HQ, segs, dtype=torch.float32, device=DEVICE))
             for _ in range(copies)]

    def kernel(i: int) -> None:
        md = mds[i]
        cuda_decode.launch_cuda_decode(q, cache.cache, md.block_table, md.seq_lens,
                                       md.query_start_loc, None, outs[i], *parts[i],
                                       HS ** -0.5, segs)

    def merge(i: int) -> None:
        _merge(*parts[i], outs[i], mds[i].query_start_loc, mds[i], 1, 1, segs, False)

    if part.startswith("call"):
        pdl = not part.endswith("0")
        trigger = "end" if part.endswith("end") else "start"

        attend = decode_attention if q_len == 1 else verify_attention

        def call(i: int) -> None:
            with cuda_settings(ATTN_PDL=pdl, ATTN_PDL_TRIGGER=trigger):
                attend(q, cache.cache, mds[i], out=outs[i], kernel="cuda")
        return [lambda i=i: call(i) for i in range(copies)]
    for i in range(copies):
        kernel(i)
    fn = kernel if part == "kernel" else merge
    return [lambda i=i: fn(i) for i in range(copies)]


def run_cuda_decompose(cache: Cache, contexts: list[int], res: dict, late, read_bw: float,
                       save) -> None:
    """Where a CUDA decode call's time goes at each context: the kernel, the merge, the call,
    and the call over a one-token context with the same grid (launch, empty CTAs, merge); the
    6-token verification call with and without programmatic dependent launch."""
    calls_pdl = ("call pdl 0", "call pdl 1", "call pdl end")
    for ctx in [1, *contexts]:
        verify = ctx >= DECOMPOSE_VERIFY_TOKENS  # the step's tokens are in the context
        for q_len, part in [(1, p) for p in ("kernel", "merge", *calls_pdl)] + [
                (DECOMPOSE_VERIFY_TOKENS, p) for p in calls_pdl if verify]:
            if late():
                return
            calls = decompose_calls(cache, ctx, part, q_len)
            us = time_graph(calls * max(1, 20 // len(calls)))
            rec = dict(kind="decode" if q_len == 1 else "verify", kernel="cuda", part=part,
                       context=ctx, q_tokens=q_len, us=round(us, 2),
                       bw_frac=round(ctx * cache.tok_bytes / (us * 1e-6) / 1e9 / read_bw, 3))
            res["cuda_decompose"].append(rec)
            print(json.dumps(rec), flush=True)
        save()


def cuda_variant_record(cache: Cache, ctx: int, q_len: int, default_us: float, bytes_: int,
                        read_bw: float, label: str, overrides: dict,
                        extra: dict | None = None, sdpa_us: float | None = None,
                        triton_us: float | None = None) -> dict:
    """The CUDA C++ kernel (decode or verification) with cuda_decode's module settings
    ``overrides`` (e.g. bf16 partials, the kernel's other dim_split), timed and checked
    against the fp32 reference, and against ``default_us``, the same call without them."""
    with cuda_settings(**overrides):
        us, err = ours_time(cache, ctx, q_len, check=True, kernel="cuda")
    rec = dict(kind="decode" if q_len == 1 else "verify", kernel=label, context=ctx,
               q_tokens=q_len, kv="int8", us=round(us, 2), **(extra or {}),
               bw_frac=round(bytes_ / (us * 1e-6) / 1e9 / read_bw, 3))
    if sdpa_us is not None:
        rec["vs_sdpa"] = round(sdpa_us / us, 3)
    if triton_us is not None:
        rec["vs_triton"] = round(triton_us / us, 3)
    return dict(rec, vs_default=round(us / default_us, 3), err=float(f"{err:.3g}"))


@functools.cache
def wgmma_ready() -> bool:
    """Whether the verification kernel's warpgroup-MMA form can run here (an sm_90a build on
    compute capability 9.0, this head size); says why not, once."""
    q = torch.empty(1, HQ, HS, device=DEVICE, dtype=torch.bfloat16)
    why = cuda_decode.wgmma_verify_problem(q)
    if why:
        print(f"warpgroup-MMA verification form not timed: {why}", flush=True)
    return why is None


def cuda_ready(cache: Cache, q_len: int = 1) -> bool:
    """Whether the CUDA C++ INT8 kernel for ``q_len`` query tokens (decode at 1, else
    verification) can serve this cache (built, layout, aligned); says why not for decode."""
    fmt = kv_format(cache.cache, HS)
    q = torch.empty(q_len, HQ, HS, device=DEVICE, dtype=torch.bfloat16)
    if q_len > 1:
        return cuda_decode.cuda_verify_problem(q, cache.cache, fmt, q, q_len) is None
    why = cuda_decode.cuda_decode_problem(q, cache.cache, fmt, q)
    if why:
        print(f"CUDA decode kernel not timed: {why}", flush=True)
    return why is None


def markdown(res: dict) -> str:
    lines = [f"# Attention kernels on {res['gpu']}", "",
             f"{res['date']}, `{res['command']}`, torch {res.get('torch')}, block size "
             f"{res.get('block_size')}; read bandwidth measured in the same run: "
             f"{res['read_gbps'] or 0:.0f} GB/s. Shape: 24 query / 4 KV heads, head dim 256, "
             "one request. `bw_frac` = (K+V bytes of the context, scales included) / time / "
             "read bandwidth; `vs_sdpa` = torch SDPA flash time on BF16 K/V / ours; "
             "`vs_decode` = verify time / the default decode kernel's time (same cache, same "
             "context; the CUDA C++ kernel on INT8 where built; `decode_int_qk`: the Triton "
             "decode); "
             "`vs_triton` = Triton time / CUDA C++ time of the same kind (`verify_int_qk`, "
             "the CUDA verification kernel with Q.K on the int8 tensor cores: the exact "
             "kernel's time / its time); `vs_default` = a CUDA C++ kernel's variant (the "
             "decode or verification kernel's other `dim_split`, the verification kernel's "
             "lazy maxima, or bf16 / fp16 partials) / the "
             "default form's "
             "time; `err` = relative L2 error against the fp32 reference.", "",
             "| kind | kernel | kv | context | q tokens | us | bw_frac | vs_sdpa | vs_decode | "
             "vs_triton | vs_default | err | sdpa us | geometry |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in res["records"]:
        if r["kind"] == "prefill":
            continue
        lines.append(f"| {r['kind']} | {r.get('kernel', 'triton')} | {r['kv']} | "
                     f"{r['context']} | {r['q_tokens']} | "
                     f"{r['us']} | {r.get('bw_frac', '')} | {r.get('vs_sdpa', '')} | "
                     f"{r.get('vs_decode', '')} | {r.get('vs_triton', r.get('vs_exact', ''))} | "
                     f"{r.get('vs_default', '')} | {r.get('err', '')} | {r.get('sdpa_us', '')} | "
                     f"{r.get('geometry', '')} |")
    nc = [r for r in res["records"] if r["kind"] == "noncausal"]
    if nc:
        lines += ["", "Non-causal 6-token blocks (a DFlash drafter's step): the split path "
                  "against the same kernel with one segment (one program per KV head over the "
                  "whole context, as vLLM's `unified_attention` launches it).", "",
                  "| kv | context | split us | one segment us | one segment / split |",
                  "|---|---|---|---|---|"]
        lines += [f"| {r['kv']} | {r['context']} | {r['us']} | {r['one_segment_us']} | "
                  f"{r['vs_one_segment']} |" for r in nc]
    pre = [r for r in res["records"] if r["kind"] == "prefill"]
    if pre:
        lines += ["", "| prefill | kv | context | chunk | us | tok/s | SDPA tok/s | vs_sdpa |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in pre:
            lines.append(f"| prefill | {r['kv']} | {r['context']} | {r['q_tokens']} | {r['us']} "
                         f"| {r['tok_s']} | {r['sdpa_tok_s']} | {r['vs_sdpa']} |")
    if res.get("sweep"):
        lines += ["", f"Geometry sweep (picked: {res.get('picked')}):", "",
                  "| kind | kv | context | geometry | us | bw_frac | rel err |",
                  "|---|---|---|---|---|---|---|"]
        for r in res["sweep"]:
            lines.append(f"| {r['kind']} | {r['kv']} | {r['context']} | {r['geometry']} | "
                         f"{r.get('us', r.get('error'))} | {r.get('bw_frac', '')} | "
                         f"{r.get('err', '')} |")
    if res.get("cuda_sweep"):
        lines += ["", "CUDA C++ INT8 decode, segmentation variants (one request; first row of "
                  "each context: the library's default):", "",
                  "| context | CTAs per SM | segments | min tiles | warps a (tile, head) | us | "
                  "bw_frac | rel err |",
                  "|---|---|---|---|---|---|---|---|"]
        decode = [r for r in res["cuda_sweep"] if r.get("kind", "decode") == "decode"]
        for r in sorted(decode, key=lambda r: r["context"]):
            lines.append(f"| {r['context']} | {r['ctas_per_sm']} | {r.get('segments', '')} | "
                         f"{r['min_tiles']} | {r.get('dim_split', 1)} | {r['us']} | "
                         f"{r['bw_frac']} | {r['err']} |")
        verify = [r for r in res["cuda_sweep"] if r.get("kind") == "verify"]
        if verify:
            lines += ["", "CUDA C++ INT8 verification, segments (one request, segments a KV "
                      "head; first row of each context: the library's default):", "",
                      "| context | q tokens | CTAs per SM of segments | segments | us | "
                      "bw_frac | rel err |", "|---|---|---|---|---|---|---|"]
            lines += [f"| {r['context']} | {r['q_tokens']} | {r['ctas_per_sm']} | "
                      f"{r['segments']} | {r['us']} | {r['bw_frac']} | {r['err']} |"
                      for r in sorted(verify, key=lambda r: r["context"])]
    if res.get("cuda_decompose"):
        lines += ["", "CUDA C++ INT8 decode, the call's parts, and the verification call "
                  "(one request; context 1: the same grid over one token):", "",
                  "| kind | context | part | us | bw_frac |", "|---|---|---|---|---|"]
        lines += [f"| {r.get('kind', 'decode')} | {r['context']} | {r['part']} | {r['us']} | "
                  f"{r['bw_frac']} |" for r in res["cuda_decompose"]]
    if res.get("errors"):
        lines += ["", "Errors:", ""] + [f"    {e.splitlines()[-1]}" for e in res["errors"]]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
