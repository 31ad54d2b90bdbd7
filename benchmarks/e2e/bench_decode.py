"""Whole-model decode and prefill speed of a Bonsai GGUF through vLLM's ``LLM()`` on a GPU.

    python benchmarks/e2e/bench_decode.py MODEL.gguf [--kv auto int8_per_token_head]
        [--mode default|eager] [--batches 1 8 32 64] [--context 1024] [--long-context 32768]
        [--prefill 512 4096] [--tp 1 [2]] [--spec-k 3 5 7 [--drafter DIR]] [--pdl 0 [1]]
        [--pq2-kernel auto [mma_cuda]] [--gemv-tuning '' ['depth=2,scales=1']]
        [--attn-kernel auto [triton]] [--dense-gemv auto [torch triton]]
        [--draft-attention prism [vllm]] [--gdn-verify prism [vllm]]
        [--gdn-spec-kernel auto [triton]] [--fresh-kv 1 [0]] [--attn-decode-split 2 [1]]
        [--fold-prefill 0 [1]] [--engine-process 0 [1]]
        [--profile-batches 1 [8]] [--host-profile] [--side-by-side]
        [--out-dir benchmarks/results]

Each KV-cache dtype runs in its own process (one engine per process), with vLLM's defaults
(torch.compile and CUDA graphs, up to 512 tokens as with vLLM's default ``max_num_seqs``;
``--mode eager`` adds ``enforce_eager``) and prefix caching off, so every prompt is really
prefilled. Prompts are random token ids, distinct per request.

* decode: a batch of B requests with a C-token prompt each generates 1 + T tokens; the step
  time is read from vLLM's per-request timestamps (engine-core monotonic clock): the request
  admitted last decodes its T tokens while the whole batch decodes (the others generate
  as many tokens more as they can have decoded while the later prompts were prefilled:
  until 2026-12-03 they generated 1 + T too and ended first, so the window's end ran below
  B), so ``(last_token_ts - first_token_ts) / T`` of that request is the step time with no
  prefill in it; aggregate tok/s is ``B / step``. ``full_batch_frac`` is the share of that
  window in which all B requests were decoding (below 0.95 a warning: e.g. 8 requests of
  32K tokens do not fit the side-by-side engines' 8 GiB INT8 cache, so the last one starts
  after another ended). (Timing ``t(1 + T) - t(1)`` of two generate() calls, the first
  method, let the variance of a 32K-64K-token prefill swamp the decode time at large B.)
* prefill: one request of P tokens generating one token: ``P / t``.
* verify (``--spec-k 3 5 7``): one engine per k with a DFlash drafter (``--drafter DIR``, or
  ``vllm-prism make-tiny-drafter`` for the model, written once), batch 1 at the first
  context: each step verifies ``q_tokens = k + 1`` tokens. The step time is the request's
  decode time over the verify steps vLLM counted in it (its ``spec_decode_num_drafts``), so
  acceptance does not enter it; it includes the drafter's own forward. The tiny drafter has
  the Bonsai 2 drafter's KV-cache shape by default (``--drafter-layers 5 --drafter-window
  2048``, spec section 5): the drafter's layers decide vLLM's KV-cache groups, and the host
  builds every group's attention metadata each step (a one-layer drafter split the 27B
  shape into 65 groups: 10.55 ms a step on an H100 against 9.32 with the 5-layer drafter's
  15). Records hold ``drafter`` and every engine's ``kv_cache_groups`` (layers a group).
  ``ratio_to_plain`` divides it by the plain batch-1 step of the same run and
  KV dtype (target: at most 1.15 at 6 tokens). Unless ``--no-profile``, the verify step is
  profiled by kernel family like a decode step (per verify step counted by vLLM).
* ``--tp 1 2`` serves with each ``tensor_parallel_size`` in turn (one engine each, same run);
  records carry ``tp``.
* ``--pdl 1 0`` runs each engine with ``VLLM_PRISM_PDL`` on, then off (programmatic dependent
  launch of the PQ2 kernels); records carry ``pdl``: whether the kernels really used it.
* ``--pq2-kernel auto mma_cuda`` runs each engine with ``VLLM_PRISM_PQ2_KERNEL`` set to each
  value (records carry ``pq2_kernel``; a kernel that cannot run a call falls back to auto);
  ``--gemv-tuning 'depth=2,scales=1' split=4`` likewise with ``VLLM_PRISM_GEMV_TUNING`` (the
  int8 GEMV's tile overrides, shown in brackets after the kernel).
* ``--dense-gemv auto torch triton`` likewise with ``VLLM_PRISM_DENSE_GEMV`` (the float
  projections, ``in_proj_ba``: the small-M Triton GEMV at M <= 8, ``F.linear``, or the GEMV
  at every M <= 16; a value other than auto is shown in the kernel label).
* ``--draft-attention prism vllm`` likewise with ``VLLM_PRISM_DRAFT_ATTENTION`` (a DFlash
  drafter's attention with an INT8 KV cache: the PRISM backend, or vLLM's own choice), for
  the engines with a drafter only: a plain engine has no drafter, so it runs once.
* ``--attn-kernel auto triton`` likewise with ``VLLM_PRISM_ATTN_KERNEL`` (the CUDA C++ INT8
  decode attention against the Triton split-KV kernel); records carry ``attn_kernel``.
* ``--fold-prefill 0 1`` likewise with ``VLLM_PRISM_PQ2_FOLD_PREFILL`` (the exact ``gemm_dq``
  prefill from M = 512, or ``wgmma_fold`` in its place on Hopper; ``[fold prefill]``).
* ``--fresh-kv 1 0`` likewise with ``VLLM_PRISM_PREFILL_FRESH_KV`` (a prompt's first chunk
  on the step's own K / V, or read back from the cache; ``[fresh kv 0]`` in the label).
* ``--attn-decode-split 2 1`` likewise with ``VLLM_PRISM_ATTN_DECODE_SPLIT`` (the CUDA C++
  INT8 decode kernel with two warps a tile and KV head, or one; ``[decode split N]`` where it
  is not the default ``auto``).
* ``--attn-pdl 1 0`` likewise with ``VLLM_PRISM_ATTN_PDL`` (the CUDA C++ INT8 attention
  kernels and their merge with programmatic dependent launch, or without; ``[attn pdl 0]``).
* ``--attn-verify-lazy 1 0`` likewise with ``VLLM_PRISM_ATTN_VERIFY_LAZY`` (the CUDA C++
  INT8 verification kernel with its lazy running maxima, or the exact softmax every stage;
  ``[verify lazy 0]``), for the engines with a drafter only.
* ``--attn-verify-form mma wgmma`` likewise with ``VLLM_PRISM_ATTN_VERIFY_FORM`` (the CUDA
  C++ INT8 verification kernel on mma.sync, or its warpgroup-MMA form on Hopper;
  ``[verify form wgmma]``), for the engines with a drafter only.
* ``--gdn-verify prism vllm`` likewise with ``VLLM_PRISM_GDN_VERIFY`` (the Gated DeltaNet
  recurrence of a verification step: vllm-prism's kernel reading its inputs in place, or
  vLLM's choice), for the engines with a drafter only.
* ``--gdn-spec-kernel auto triton`` likewise with vLLM's ``VLLM_GDN_DECODE_KERNEL`` (the
  Gated DeltaNet of a verification step: ``auto`` leaves it unset, vLLM's choice, its fused
  CUDA kernel with one program per value head where the layer allows; ``cuda`` or
  ``triton`` names one), for the engines with a drafter only.
* ``--engine-process 0 1`` likewise with ``VLLM_ENABLE_V1_MULTIPROCESSING``: by default each
  engine's core runs in the benchmark's process (so the torch profiler sees its kernels), and
  every step's host work (scheduling, input preparation, sampling, output processing) runs
  serially with the GPU; ``1`` gives the core its own process, as ``vllm serve`` does
  (labelled ``[engine process]``, not profiled).
* Each of these switches exported in the benchmark's environment (``VLLM_PRISM_DENSE_GEMV=
  triton python benchmarks/e2e/bench_decode.py ...``) is its option's default: every engine
  runs with it unless the option names values. (Until 2026-12-03 the options' own defaults
  overrode it.)
* ``--side-by-side`` starts every engine of the run at once, each with ``--gpu-memory`` over
  the number of engines (their compiles and CUDA-graph captures overlap: a cold start of the
  27B-shaped file takes about 4 minutes); each warms up (one short generation per prompt
  length it measures: the first call compiles the prefill paths' Triton kernels), waits for
  the others to be warm, then measures in its turn (a file lock), and exits only once every
  engine has measured, so no engine's timing shares the GPU with another's work or shutdown.
* ``--rounds N`` (side by side) measures every engine N times, in start order in even rounds
  and in reverse order in odd ones; each record is its round of median step time, with all
  rounds' times as ``rounds_ms``. (2026-12-03: an A/B whose engine measured right after the
  engines' concurrent warm-ups was 10 % slower than its partner measured last; which engine
  measures first had followed which warmed first, so the order was never varied.)
* profile (batch 1, or each of ``--profile-batches``; first context): torch-profiler traces
  of two generate() calls of T/2 and T decode steps, whose difference gives per decode step
  the kernel time by family (PQ2 linears, attention, Gated DeltaNet, norms/element-wise,
  sampler, other; span and own time), the kernel count, the ``TOP_KERNELS`` kernels by name
  (span, own time and launches per step; own time: see :func:`own_time`) and the GPU-busy
  share: the union of kernel intervals over the step time measured without the profiler.
  (The first runs attributed one trace to decode by a wall-clock ratio.)
* ``--host-profile``: cProfile of one generate() call over its decode steps only (from the
  first decode or verification step's CUDA-graph dispatch on, :class:`StepWatch`), the host's
  Python time per step (own-time total, the functions by cumulative and by own time): where
  a step's host work goes when the GPU idles in it (the engine core in this process only).
  (Until 2026-12-04 it was the difference of two calls' profiles like the kernel profile's,
  where any difference between the two calls' prefills counts as decode time: the profile of
  a 32K verification step that day listed vLLM's eager Gated DeltaNet forward, which a
  full-graph step does not run, at 3.7 ms a step.)
* the batch-1..N decode and verification records hold ``graph_modes`` (how vLLM's
  CUDA-graph dispatch ran their measured steps, e.g. ``{"FULL": 96}``, recorded in the engine
  core's process either way; vllm_prism/engine/step_record.py); a verification record also
  ``draft_graph_modes`` (the drafter's dispatches) and ``verify_steps`` (the steps vLLM
  counted: fewer recorded than counted means steps run eagerly without a dispatch); each record
  the host's CPU model and a Python timing (``host_cpu``, ``host_py_ms``: the host's speed,
  which a step with GPU idle depends on).

``ceiling_frac`` is the bytes a step must move (the ternary weights but the embedding, plus
the KV cache read for every request's context, plus each request's Gated DeltaNet state read
and written) over the read bandwidth measured in the same run, divided by the step time.
Results: ``<out-dir>/e2e_<gpu>.json`` and ``.md`` (records of earlier runs with other modes or
KV dtypes are kept; the same (mode, kv, batch, context, drafter) run with the same explicit
value of every engine switch, kept in the record's ``switches``, is replaced; each row gives
its run's date).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import fcntl
import itertools
import json
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "kernels"))
sys.path.insert(0, str(HERE.parents[1]))

from vllm_prism import envs  # noqa: E402  (cheap: no torch, no vLLM)
from vllm_prism.engine import step_record  # noqa: E402  (likewise)

FAMILIES = [  # (family, substrings of kernel names), first match wins
    ("pq2_linear", ("_act_kernel", "gemv", "_mma", "pq2", "_tc_", "ptq1")),
    ("attention", ("split_kv", "_merge_kernel", "flash", "attn", "gather_kv", "reshape_and_cache",
                   "unified_attention", "int8_decode", "int8_verify", "reshape_cache")),
    ("gated_deltanet", ("gated_delta", "chunk_", "fused_recurrent", "causal_conv1d", "conv1d",
                        "gdn", "l2norm", "solve_tril", "cumsum", "fused_gdn", "recompute_w_u",
                        "kkt")),
    ("sampler", ("sampl", "topk", "top_k", "argmax", "argsort", "softmax", "gumbel",
                 "exponential")),
    ("gemm_bf16", ("gemm", "cutlass", "sm90_xmma", "nvjet", "cublas")),
    ("norm_elementwise", ("triton_", "rms", "norm", "elementwise", "vectorized", "unrolled",
                          "reduce", "silu", "mul", "add", "copy", "fill", "index", "cat",
                          "embedding")),
]


TOP_KERNELS = 30  # kernels by name a profiled step lists (the most time first)
GPU_EVENT_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")  # of a Chrome trace


def family_of(name: str) -> str:
    low = name.lower()
    for fam, keys in FAMILIES:
        if any(k in low for k in keys):
            return fam
    return "other"


def model_bytes(path: str) -> tuple[int, dict[str, int]]:
    """(bytes of the ternary tensors a decode step reads: all but the embedding,
    geometry numbers)."""
    from vllm_prism.gguf.qwen35 import qwen35_dims
    from vllm_prism.gguf.reader import GGUFReader

    with GGUFReader(path) as r:
        weights = sum(t.nbytes for n, t in r.tensors.items() if n != "token_embd.weight")
        dims = qwen35_dims(r.metadata, r.path, vocab_size=r.tensors["token_embd.weight"].shape[0])
    n_full = sum(1 for t in dims.layer_types if t == "full_attention")
    n_gdn = dims.n_layers - n_full
    geo = {"kv_bf16_per_token": n_full * dims.n_kv_heads * dims.head_dim * 2 * 2,
           "kv_int8_per_token": n_full * dims.n_kv_heads * (dims.head_dim + 4) * 2,
           "gdn_state": n_gdn * dims.n_v_heads * dims.head_k_dim * dims.head_v_dim * 4}
    return weights, geo


def step_bytes(weights: int, geo: dict[str, int], kv: str, batch: int, context: int) -> int:
    per_tok = geo["kv_int8_per_token"] if kv.startswith("int8") else geo["kv_bf16_per_token"]
    return weights + batch * (context * per_tok + 2 * geo["gdn_state"])


# --------------------------------------------------------------------------- one engine


def _prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    import random

    rng = random.Random(seed)
    return [[rng.randrange(10, vocab) for _ in range(length)] for _ in range(n)]


def _generate(llm, prompts, max_tokens: int | list[int]):
    """(seconds, outputs) of one generate() call; ``max_tokens`` for every prompt or one
    count each."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    counts = max_tokens if isinstance(max_tokens, list) else [max_tokens] * len(prompts)
    sps = [SamplingParams(max_tokens=n, min_tokens=n, temperature=0, ignore_eos=True,
                          detokenize=False) for n in counts]
    t0 = time.perf_counter()
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], sps,
                        use_tqdm=False)
    dt = time.perf_counter() - t0
    assert all(len(o.outputs[0].token_ids) == n for o, n in zip(outs, counts))
    return dt, outs


def _timed(llm, prompts, max_tokens: int) -> float:
    return _generate(llm, prompts, max_tokens)[0]


def head_start_steps(batch: int, context: int, tokens_per_step: int = 8192) -> int:
    """Decode steps the first requests of a batch can take before the last one's first
    token, at most: the steps that prefill the others' prompts, and a margin."""
    return -(-(batch - 1) * context // tokens_per_step) + 4 if batch > 1 else 0


def full_batch_fraction(metrics: list) -> float:
    """The share of the last-admitted request's decode window during which every request of
    the batch was still decoding (1: the whole window at the full batch; less where the
    others ended first, e.g. when the KV cache held fewer requests than the batch)."""
    last = max(metrics, key=lambda m: m.first_token_ts)
    window = last.last_token_ts - last.first_token_ts
    if window <= 0:
        return 1.0
    end = min(m.last_token_ts for m in metrics)
    return min(1.0, max(0.0, (end - last.first_token_ts) / window))


def _decode_step_s(llm, prompts, steps: int, reps: int = 3,
                   context: int = 0) -> tuple[float, float]:
    """(median decode step time of the last-admitted request, the smallest
    :func:`full_batch_fraction` of the reps) (see the module docstring). The other requests
    generate ``head_start_steps`` tokens more, so that they are still decoding throughout the
    last one's window."""
    extra = head_start_steps(len(prompts), context)
    counts = [1 + steps + extra] * (len(prompts) - 1) + [1 + steps]
    per_step, fracs = [], []
    for _ in range(reps):
        _, outs = _generate(llm, prompts, counts)
        metrics = [o.metrics for o in outs]
        last = max(metrics, key=lambda m: m.first_token_ts)
        per_step.append((last.last_token_ts - last.first_token_ts) / steps)
        fracs.append(full_batch_fraction(metrics))
    return statistics.median(per_step), min(fracs)


def short_kernel_name(name: str, width: int = 80) -> str:
    """A kernel's name as the profile tables show it: anonymous namespaces, C++ template
    arguments and parameter lists dropped, cut to ``width`` characters."""
    name = name.replace("(anonymous namespace)::", "")
    for sep in ("<", "("):
        if sep in name:
            name = name[:name.index(sep)]
    name = name.removeprefix("void ").strip()
    return name if len(name) <= width else name[:width - 3] + "..."


def own_time(intervals: list[tuple[float, float]]) -> list[float]:
    """Each interval's share of the union of all: every instant belongs to the earliest-started
    interval still running. With programmatic dependent launch a kernel starts while the one
    before it runs and waits for it, so its span double-counts; the earliest running kernel is
    the one working (the shares add up to the GPU-busy time)."""
    import heapq

    events = sorted([(s, 1, i) for i, (s, _) in enumerate(intervals)]
                    + [(e, 0, i) for i, (_, e) in enumerate(intervals)])
    own = [0.0] * len(intervals)
    running: list[tuple[float, int]] = []
    ended = [False] * len(intervals)
    prev = None
    for t, is_start, i in events:
        while running and ended[running[0][1]]:
            heapq.heappop(running)
        if running and prev is not None:
            own[running[0][1]] += t - prev
        prev = t
        if is_start:
            heapq.heappush(running, (intervals[i][0], i))
        else:
            ended[i] = True
    return own


def kernel_records(trace: dict) -> list[tuple[str, float, float, str]]:
    """(name, start us, end us, grid) of every GPU kernel, copy and memset of a torch-profiler
    Chrome trace (``grid`` "x,y,z" where the trace records it, else "")."""
    out = []
    for ev in trace.get("traceEvents", []):
        if ev.get("cat") not in GPU_EVENT_CATEGORIES or "dur" not in ev:
            continue
        grid = (ev.get("args") or {}).get("grid")
        grid_s = ",".join(str(g) for g in grid) if isinstance(grid, list) else ""
        out.append((ev["name"], float(ev["ts"]), float(ev["ts"]) + float(ev["dur"]), grid_s))
    return out


def summarize_kernels(kernels: list[tuple[str, float, float, str]]
                      ) -> tuple[float, dict[str, float], int, dict[str, tuple[float, int, float]]]:
    """(GPU-busy time: the union of the kernels' intervals; span time by family; the number of
    kernels; (span, launches, own time: :func:`own_time`) by short name and grid) of
    :func:`kernel_records`. The grid tells apart launches of one kernel on different shapes
    (e.g. a GEMV on each projection of a layer and on the LM head)."""
    by_family: dict[str, float] = {}
    by_name: dict[str, tuple[float, int, float]] = {}
    owns = own_time([(s, e) for _, s, e, _ in kernels])
    for (name, s, e, grid), own in zip(kernels, owns):
        by_family[family_of(name)] = by_family.get(family_of(name), 0.0) + (e - s)
        key = _kernel_key(name, grid)
        us, n, o = by_name.get(key, (0.0, 0, 0.0))
        by_name[key] = (us + (e - s), n + 1, o + own)
    return sum(owns), by_family, len(kernels), by_name


def _trace(llm, prompts, max_tokens: int
           ) -> tuple[float, dict[str, float], int, dict[str, tuple[float, int, float]],
                      dict[str, list[float]]]:
    """Profile one generate() call: :func:`summarize_kernels` of its GPU kernels, and the
    start times of each kernel key (short name and grid) in order."""
    import tempfile

    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        _timed(llm, prompts, max_tokens)
    torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            kernels = kernel_records(json.load(f))
    if not kernels:  # a trace without kernel events: the profiler's own event list
        kernels = [(e.name, e.time_range.start, e.time_range.end, "") for e in prof.events()
                   if e.device_type == torch.autograd.DeviceType.CUDA]
    starts: dict[str, list[float]] = {}
    for name, start, _, grid in sorted(kernels, key=lambda k: k[1]):
        starts.setdefault(_kernel_key(name, grid), []).append(start)
    return (*summarize_kernels(kernels), starts)


def _kernel_key(name: str, grid: str) -> str:
    """A kernel's short name with its grid (launches of one kernel on different shapes apart)."""
    return f"{short_kernel_name(name)} [{grid}]" if grid else short_kernel_name(name)


def traced_step_us(per_step_launches: dict[str, float], starts: dict[str, list[float]]
                   ) -> float | None:
    """The step period as the GPU saw it in a profiled call: the mean interval between the
    launches after the first of a kernel launched once a step on average (the first such key
    in name order; None where there is none): the span from its second launch to its last
    over the launches between. Unlike the call's span over its steps, the prefill's and the
    first token's time, which vary between calls, do not enter it; unlike a median interval
    (until 2026-12-03: half the step of DFlash verification, 3.6 against 7.9 ms), a kernel
    launched twice in some steps and in others not at all does not skew it."""
    once = sorted(k for k, n in per_step_launches.items() if abs(n - 1.0) < 1e-9
                  and len(starts.get(k, ())) >= 3)
    if not once:
        return None
    t = starts[once[0]]
    return (t[-1] - t[1]) / (len(t) - 2)


def _profile(llm, prompts, steps: int, step_s: float,
             counter: Callable[[], int] | None = None) -> dict:
    """Per decode step: kernel time by family, kernel count and GPU-busy time, as the
    difference of two profiled generate() calls of 1 + steps/2 and 1 + steps tokens (the
    prefill and the first sampled token cancel out), over the step time measured without
    the profiler. ``counter`` (cumulative engine steps, e.g. verify steps) counts the steps
    of each call; without it a call of 1 + n tokens has n decode steps."""
    _timed(llm, prompts, 1 + steps)  # warm
    half = steps // 2
    c0 = counter() if counter else 0
    busy_a, fam_a, n_a, names_a, _ = _trace(llm, prompts, 1 + half)
    c1 = counter() if counter else half
    busy_b, fam_b, n_b, names_b, starts_b = _trace(llm, prompts, 1 + steps)
    c2 = counter() if counter else half + steps
    d = max((c2 - c1) - (c1 - c0), 1)
    per_step_us = {k: max(0.0, v - fam_a.get(k, 0.0)) / d for k, v in sorted(fam_b.items())}
    busy_per_step_us = (busy_b - busy_a) / d
    zero = (0.0, 0, 0.0)
    per_name = {k: tuple((x - y) / d for x, y in zip(v, names_a.get(k, zero)))
                for k, v in names_b.items()}
    top = sorted(((k, *v) for k, v in per_name.items() if v[1] > 0), key=lambda t: -t[3])
    own_by_family: dict[str, float] = {}
    for k, _, _, own in top:
        own_by_family[family_of(k)] = own_by_family.get(family_of(k), 0.0) + own
    # the step as the profiled call ran it (not the timed run's wall time): where the timed
    # step is much longer, the idle came and went between runs (host time)
    period = traced_step_us({k: v[1] for k, v in per_name.items()}, starts_b)
    return {"kernel_us_per_step": per_step_us, "busy_us_per_step": busy_per_step_us,
            "gpu_busy_frac": min(1.0, busy_per_step_us * 1e-6 / step_s),
            **({"traced_step_us": period} if period is not None else {}),
            "kernels_per_step": (n_b - n_a) / d,
            "kernel_own_us_per_step": {k: round(v, 2) for k, v in sorted(own_by_family.items())},
            "top_kernels_per_step": [{"name": k, "family": family_of(k), "us": round(us, 2),
                                      "launches": round(n, 2), "own_us": round(own, 2)}
                                     for k, us, n, own in top[:TOP_KERNELS]]}


def _num_drafts(llm) -> int:
    return int(next((m.value for m in llm.get_metrics()
                     if m.name == "vllm:spec_decode_num_drafts"), 0))


# functions a host profile lists, by cumulative and by own time
HOST_TOP = 20


def function_times(stats: dict) -> dict[str, tuple[float, float]]:
    """{"file.py:function": (own seconds, cumulative seconds)} of a ``pstats.Stats.stats``
    table (functions of one name in one file added up)."""
    out: dict[str, tuple[float, float]] = {}
    for (path, _, func), (_, _, own, cum, _) in stats.items():
        key = f"{os.path.basename(path)}:{func}" if path != "~" else func
        o, c = out.get(key, (0.0, 0.0))
        out[key] = (o + own, c + cum)
    return out


def host_profile(times: dict[str, tuple[float, float]], steps: int) -> dict:
    """Per step, the host's Python time of ``steps`` profiled steps: the total own time and
    the ``HOST_TOP`` functions by cumulative and by own time, in ms."""
    per = {k: tuple(x * 1e3 / max(steps, 1) for x in v) for k, v in times.items()}

    def top(i: int) -> list[dict]:
        rows = sorted(per.items(), key=lambda kv: -kv[1][i])[:HOST_TOP]
        return [{"function": k, "own_ms": round(v[0], 4), "cum_ms": round(v[1], 4)}
                for k, v in rows]

    return {"host_ms_per_step": round(sum(v[0] for v in per.values()), 4),
            "host_profiled_steps": steps, "host_top_cumulative": top(1),
            "host_top_own": top(0)}


class StepWatch:
    """Runs a profiler over an in-process engine's decode steps only: from the dispatch
    (vllm_prism/engine/step_record.py) of the first uniform step of ``query_len`` tokens a
    request (k + 1: verification; 1: plain decode) to the end of the call, stopped at any
    other step (a prefill chunk); ``profiled`` counts the steps it covered."""

    def __init__(self) -> None:
        self.reset(1)

    def reset(self, query_len: int, profiler=None) -> None:
        self.query_len, self.profiler, self.on, self.profiled = query_len, profiler, False, 0

    def __call__(self, entry: list) -> None:
        if self.profiler is None:
            return
        if not step_record.is_uniform(entry, self.query_len):
            if self.on:
                self.profiler.disable()
                self.on = False
            return
        if not self.on:
            self.profiler.enable()
            self.on = True
        self.profiled += 1

    def stop(self) -> None:
        if self.on:
            self.profiler.disable()
            self.on = False


_WATCH = StepWatch()
# whether this engine's step recorder is installed (None: not tried yet)
_RECORDING: bool | None = None


def _steps_mark(llm) -> tuple[int, int] | None:
    """Installs the step recorder in the engine's worker at the first call (with the
    :class:`StepWatch` where the worker runs in this process; vLLM runs a function given to
    collective_rpc in the worker's process otherwise) and returns how many target and
    drafter dispatches it has recorded so far; None where it could not be installed (a
    warning line: a diagnostic must not cost the run its measurements)."""
    global _RECORDING
    if _RECORDING is None:
        tp = getattr(getattr(getattr(llm, "llm_engine", None), "vllm_config", None),
                     "parallel_config", None)
        here = not _engine_process() and getattr(tp, "tensor_parallel_size", 1) == 1
        try:
            llm.collective_rpc(step_record.install, args=(_WATCH,) if here else ())
            _RECORDING = True
        except Exception as e:  # noqa: BLE001
            print(json.dumps({"warning": f"no CUDA-graph record: {e!r}"[:300]}), flush=True)
            _RECORDING = False
    if not _RECORDING:
        return None
    return tuple(llm.collective_rpc(step_record.counts)[0])


def graph_modes(entries: list, query_len: int | None) -> dict[str, int]:
    """How many recorded steps vLLM's dispatch ran in each CUDA-graph mode (e.g.
    ``{"FULL": 96}``): the uniform steps of ``query_len`` tokens a request, or every entry
    where ``query_len`` is None."""
    out: dict[str, int] = {}
    for e in entries:
        if query_len is None or step_record.is_uniform(e, query_len):
            out[e[2]] = out.get(e[2], 0) + 1
    return out


def _modes_since(llm, mark: tuple[int, int] | None, query_len: int, draft: bool) -> dict:
    """``graph_modes`` of the target's steps recorded since ``mark`` and, with ``draft``,
    ``draft_graph_modes`` (the drafter's dispatches since then); {} without a record."""
    if mark is None:
        return {}
    out = {"graph_modes": graph_modes(
        llm.collective_rpc(step_record.read, args=(mark[0],))[0], query_len)}
    if draft:
        out["draft_graph_modes"] = graph_modes(
            llm.collective_rpc(step_record.read_draft, args=(mark[1],))[0], None)
    return out


def _host_profile(llm, prompts, steps: int, query_len: int) -> dict:
    """cProfile of one generate() call of 1 + steps tokens, over its decode steps only
    (:class:`StepWatch`: the profiler runs from the first step of ``query_len`` tokens a
    request; the engine core runs in this thread: VLLM_ENABLE_V1_MULTIPROCESSING is 0), as
    :func:`host_profile`. The profiler slows Python, so its times are shares, not the step's."""
    import cProfile
    import pstats

    assert not _engine_process(), "a host profile needs the engine core in this process"
    prof = cProfile.Profile()
    if _steps_mark(llm) is None:  # the recorder, with the watch, is installed
        return {}
    _WATCH.reset(query_len, prof)
    try:
        _generate(llm, prompts, 1 + steps)
    finally:
        _WATCH.stop()
        profiled = _WATCH.profiled
        _WATCH.reset(query_len)  # the watch lets the engine's later steps be
    return host_profile(function_times(pstats.Stats(prof).stats), profiled)


def host_fingerprint() -> dict:
    """The host CPU's model and the best of five timings of a fixed pure-Python workload
    (``host_py_ms``): the host's speed, which a step whose GPU idles depends on."""
    model = ""
    with contextlib.suppress(OSError):
        model = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                      if line.startswith("model name")), "")
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        d: dict[int, int] = {}
        for i in range(200_000):
            d[i & 1023] = d.get(i & 1023, 0) + i
        best = min(best, time.perf_counter() - t0)
    return {"host_cpu": model or "unknown", "host_cpus": os.cpu_count() or 0,
            "host_py_ms": round(best * 1e3, 2)}


def _verify_record(llm, args: argparse.Namespace, base: dict, vocab: int) -> dict:
    """Batch-1 step time while every step verifies k + 1 tokens (see the module docstring)."""
    k = args.spec_k[0]
    prompts = _prompts(1, args.context, vocab, seed=1)
    _generate(llm, prompts, 1 + args.steps)  # warm-up
    per_step, per_token = [], []
    mark, verify_steps_total = _steps_mark(llm), 0
    for _ in range(3):
        drafts = _num_drafts(llm)
        _, outs = _generate(llm, prompts, 1 + args.steps)
        m = outs[0].metrics
        verify_steps = _num_drafts(llm) - drafts
        verify_steps_total += verify_steps
        per_step.append((m.last_token_ts - m.first_token_ts) / max(verify_steps, 1))
        per_token.append((m.last_token_ts - m.first_token_ts) / args.steps)
    step = statistics.median(per_step)
    rec = {**base, "kind": "verify", "batch": 1, "context": args.context, "q_tokens": k + 1,
           "ms_per_step": step * 1e3, "tok_s": 1 / statistics.median(per_token),
           "tokens_per_step": step / statistics.median(per_token)}
    # how vLLM ran the measured verification steps and the drafter
    rec.update(_modes_since(llm, mark, k + 1, draft=True), verify_steps=verify_steps_total)
    if args.profile:  # the verify step by kernel family (target and drafter together)
        rec.update(_profile(llm, prompts, args.steps, step, counter=lambda: _num_drafts(llm)))
    if args.host_profile:
        rec.update(_host_profile(llm, prompts, args.steps, k + 1))
    return rec


def _progress(kind: str, batch: int, context: int) -> None:
    """A progress line for the parent (echoed with the seconds since the engine started), so a
    run cut off by a time limit shows which measurement it was in."""
    print(json.dumps({"measuring": kind, "batch": batch, "context": context}), flush=True)


@contextlib.contextmanager
def _measure_turn(lock: str | None) -> Iterator[None]:
    """This engine's turn to measure: an exclusive lock on the file ``lock`` (engines
    started side by side measure one at a time); no lock when ``lock`` is None."""
    if not lock:
        yield
        return
    with open(lock, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def turn_slot(index: int, engines: int, rnd: int) -> int:
    """Where engine ``index`` measures in round ``rnd``: in start order in even rounds, in
    reverse order in odd ones (so that with two rounds every engine measures once early and
    once late: the first turn after the warm-ups is not the same for all)."""
    return index if rnd % 2 == 0 else engines - 1 - index


def _wait_turn(lock: str, slot: int, timeout_s: float | None = None) -> None:
    """Wait until ``slot`` turns have been taken (the lines of ``lock``.turns), or
    ``timeout_s`` (default ``EXIT_WAIT_S``) passed: an engine that failed must not hold the
    others (its parent also counts its turns as taken)."""
    _wait_lines(Path(f"{lock}.turns"), slot, EXIT_WAIT_S if timeout_s is None else timeout_s)


def median_round(rounds: list[list[dict]]) -> list[dict]:
    """One record per measurement: of each measurement's rounds the one with the median
    step time (the lower middle of an even count), with every round's step time as
    ``rounds_ms``, and what only the first round has (its profile) kept."""
    out = []
    for recs in zip(*rounds):
        ms = [r["ms_per_step"] for r in recs]
        pick = sorted(recs, key=lambda r: r["ms_per_step"])[(len(recs) - 1) // 2]
        out.append({**recs[0], **pick, "rounds_ms": ms} if len(recs) > 1 else pick)
    return out


def measure_rounds(llm, args: argparse.Namespace) -> list[dict]:
    """This engine's records over ``args.rounds`` measuring turns (side by side: each round's
    turn at this engine's :func:`turn_slot`), one record per measurement
    (:func:`median_round`); the profilers run in the first round only."""
    rounds = []
    for rnd in range(args.rounds):
        if args.turn_lock and args.rounds > 1:
            _wait_turn(args.turn_lock,
                       rnd * args.engines + turn_slot(args.engine_index, args.engines, rnd))
        with _measure_turn(args.turn_lock):
            rounds.append(_measure(llm, args))
            if args.turn_lock:
                _arrive(args.turn_lock, "turns", f"{os.getpid()} {args.engine_index} {rnd}")
        args.profile = args.host_profile = False  # the first round's profile is the one
    return median_round(rounds)


def run_engine(args: argparse.Namespace) -> None:
    """All measurements of one KV dtype (called in the child process), taken in this
    engine's turns (``--turn-lock``; ``--rounds`` of them, the order reversed every other
    round), printed as one ``RECORDS`` line."""
    llm = _engine(args)
    if _engine_process():  # neither profiler here would see the engine core's work
        args.profile = args.host_profile = False
    if args.turn_lock:  # side by side: warm up together, then measure one at a time
        _warm_up(llm, args)
        _barrier(args.turn_lock, args.engines)
    print("RECORDS " + json.dumps(measure_rounds(llm, args)), flush=True)
    if args.turn_lock:
        # Leave only when every engine has measured: an engine's exit (seconds of host and GPU
        # work) disturbed the one measuring after it (2026-12-01: the same verify step 10.5
        # and 13.7 ms; 2026-12-02: a 6.06 ms plain step beside an exiting DFlash engine).
        _barrier(args.turn_lock, args.engines, EXIT_WAIT_S, "done")
        if _engine_process():
            # an engine core in its own process would outlive os._exit and keep this engine's
            # output pipe open (2026-12-02: the benchmark waited for it until its deadline
            # and lost the record)
            llm.llm_engine.engine_core.shutdown(timeout=30)
        sys.stderr.flush()
        os._exit(0)  # vLLM's orderly shutdown is not needed for a benchmark's engine


def _warm_up(llm, args: argparse.Namespace) -> None:
    """One short generation per prompt length this engine measures, so that the first call's
    compilations (Triton kernels of the prefill paths) happen before the measuring turns,
    while every engine still starts or warms up."""
    vocab = llm.llm_engine.model_config.get_vocab_size()
    lengths = [args.context] if args.spec_k else [args.context, *args.prefill]
    for n in lengths:
        _generate(llm, _prompts(1, n, vocab, seed=7), 2)
    print(json.dumps({"warm": lengths}), flush=True)


# How long a side-by-side engine that has measured waits for the others before it exits.
EXIT_WAIT_S = 1800.0


def _arrive(lock: str, stage: str, line: str) -> None:
    """Adds ``line`` to the barrier file ``lock``.``stage`` (under its file lock)."""
    with open(f"{lock}.{stage}", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.write(f"{line}\n")
        fcntl.flock(f, fcntl.LOCK_UN)


def _barrier(lock: str, engines: int, timeout_s: float = 240.0, stage: str = "ready") -> None:
    """Wait until ``engines`` engines have reached ``stage`` (a line each in ``lock``.stage:
    "ready", warmed up; "done", measured), or ``timeout_s`` passed (an engine that failed
    must not hold the others)."""
    _arrive(lock, stage, str(os.getpid()))
    _wait_lines(Path(f"{lock}.{stage}"), engines, timeout_s)


def _wait_lines(path: Path, count: int, timeout_s: float) -> None:
    """Wait until the file ``path`` has ``count`` lines (a missing file has none), or
    ``timeout_s`` passed."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end and (
            len(path.read_text().splitlines()) if path.exists() else 0) < count:
        time.sleep(0.5)


def _engine(args: argparse.Namespace):
    """The engine of one child process."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    if _engine_process():
        # the step recorder's functions go to the engine core's process through
        # collective_rpc, which vLLM pickles only with this set (before the engine starts)
        os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    from vllm import LLM

    kv = args.kv[0]
    max_len = max([args.context, args.long_context or 0, *args.prefill]) + 256
    extra = {}
    if args.spec_k:
        extra["speculative_config"] = {"method": "dflash", "model": args.drafter,
                                       "num_speculative_tokens": args.spec_k[0]}
    llm = LLM(args.model, kv_cache_dtype=kv, enforce_eager=args.mode == "eager",
              enable_prefix_caching=False, max_model_len=max_len,
              max_num_seqs=_max_num_seqs(args), gpu_memory_utilization=args.gpu_memory,
              max_num_batched_tokens=max([8192, *args.prefill]), seed=0,
              tensor_parallel_size=args.tp[0],
              kv_cache_memory_bytes=int(args.kv_cache_gib * 2**30) if args.turn_lock else None,
              disable_log_stats=False, **extra)  # per-request timestamps for the step time
    print(json.dumps({"engine": "ready", "kv": kv}), flush=True)  # progress for the parent
    return llm


# A decode record whose batch decoded together for less of its window is flagged (a
# warning line; the record keeps ``full_batch_frac``).
FULL_BATCH_MIN = 0.95

# At least vLLM's default max_num_seqs on smaller GPUs (1024 on an H200): from 256 on, vLLM
# captures CUDA graphs up to 512 tokens (2 x max_num_seqs, at most 512), so a 512-token
# prefill replays piecewise graphs as it does for a user. (Until 2026-12-01 the plain engines
# took the largest batch measured, 8, and so captured only up to 16 tokens.)
DEFAULT_MAX_NUM_SEQS = 256


def _max_num_seqs(args: argparse.Namespace) -> int:
    """The engine's max_num_seqs: ``DEFAULT_MAX_NUM_SEQS`` for plain engines (or the largest
    batch measured, if larger); the largest batch (1) for DFlash engines, whose graph sizes
    grow with k + 1 tokens a request."""
    return max(args.batches) if args.spec_k else max(DEFAULT_MAX_NUM_SEQS, *args.batches)


def _measure(llm, args: argparse.Namespace) -> list[dict]:
    """The records of one engine (see the module docstring)."""
    kv = args.kv[0]
    vocab = llm.llm_engine.model_config.get_vocab_size()
    import torch

    from vllm_prism.kernels.common import use_pdl

    base = {"kv": kv, "mode": args.mode, "tp": args.tp[0],
            "pdl": int(use_pdl(torch.device("cuda"))),
            "pq2_kernel": _kernel_label(bool(args.spec_k)),
            "attn_kernel": os.environ.get("VLLM_PRISM_ATTN_KERNEL", "auto") or "auto",
            **host_fingerprint(), **_kv_groups(llm)}
    if args.spec_k:
        base["drafter"] = _drafter_shape(args.drafter)
        _progress("verify", 1, args.context)
        return [_verify_record(llm, args, base, vocab)]
    records = []
    for b in args.batches:
        _progress("decode", b, args.context)
        prompts = _prompts(b, args.context, vocab, seed=b)
        steps = args.steps if b <= 8 else max(16, args.steps // 2)
        mark = _steps_mark(llm)
        step, frac = _decode_step_s(llm, prompts, steps, reps=3 if b <= 8 else 1,
                                    context=args.context)
        rec = {**base, "kind": "decode", "batch": b, "context": args.context,
               "ms_per_step": step * 1e3, "tok_s": b / step, "full_batch_frac": frac}
        rec.update(_modes_since(llm, mark, 1, draft=False))  # how vLLM ran them
        if frac < FULL_BATCH_MIN:
            print(json.dumps({"warning": f"batch {b} at {args.context} tokens: the whole "
                              f"batch decoded together for {frac:.0%} of the measured "
                              "steps (the KV cache holds fewer requests? raise "
                              "--kv-cache-gib or lower --context)"}), flush=True)
        if args.profile and b in args.profile_batches:
            rec.update(_profile(llm, prompts, steps, step))
        if args.host_profile and b in args.profile_batches:
            rec.update(_host_profile(llm, prompts, steps, 1))
        records.append(rec)
        print(json.dumps(rec), flush=True)
    if args.long_context:
        _progress("decode", 1, args.long_context)
        prompts = _prompts(1, args.long_context, vocab, seed=99)
        step, _ = _decode_step_s(llm, prompts, args.steps, reps=1)
        rec = {**base, "kind": "decode", "batch": 1, "context": args.long_context,
               "ms_per_step": step * 1e3, "tok_s": 1 / step}
        records.append(rec)
        print(json.dumps(rec), flush=True)
    for p in args.prefill:
        _progress("prefill", 1, p)
        prompts = _prompts(1, p, vocab, seed=p)
        _timed(llm, prompts, 1)
        t = statistics.median(_timed(llm, prompts, 1) for _ in range(3))
        rec = {**base, "kind": "prefill", "batch": 1, "context": p, "ms_per_step": t * 1e3,
               "tok_s": p / t}
        records.append(rec)
        print(json.dumps(rec), flush=True)
    return records


# ------------------------------------------------------------------------------- driver


def _tiny_drafter(model: str, layers: int, window: int) -> str:
    """The tiny DFlash drafter for ``model`` with the KV-cache shape of a real one: ``layers``
    layers, sliding-window attention over ``window`` tokens (0: full attention)."""
    import tempfile

    from vllm_prism.spec_decode.tiny_drafter import make_tiny_drafter

    return make_tiny_drafter(Path(tempfile.mkdtemp(prefix="drafter-")), model, layers=layers,
                             sliding_window=window or None)["path"]


def _drafter_shape(path: str) -> str:
    """The drafter's layer count and attention (what decides the KV-cache groups), from its
    config.json: e.g. "5 layers, window 2048"; where its ``layer_types`` mix sliding-window and
    full-attention layers, both counts: "5 layers: 4 window 2048, 1 full attention"."""
    config = json.loads((Path(path) / "config.json").read_text())
    swa = config.get("dflash_config", {})
    window = swa.get("swa_window_size") if swa.get("use_swa") else config.get("sliding_window")
    n = config["num_hidden_layers"]
    layers = f"{n} layer{'s' if n != 1 else ''}"
    types = config.get("layer_types") or []
    n_swa = sum(t == "sliding_attention" for t in types)
    if window and 0 < n_swa < len(types):
        return f"{layers}: {n_swa} window {window}, {len(types) - n_swa} full attention"
    return f"{layers}, " + (f"window {window}" if window else "full attention")


def _kv_groups(llm) -> dict:
    """``kv_cache_groups``: the layer count of each of the engine's KV-cache groups ({} where
    collective_rpc cannot reach the worker)."""
    try:
        return {"kv_cache_groups": llm.collective_rpc(step_record.kv_cache_groups)[0]}
    except Exception as e:  # noqa: BLE001
        print(json.dumps({"warning": f"no KV-cache groups: {e!r}"[:300]}), flush=True)
        return {}


def _default(name: str) -> str:
    """The default of a vllm-prism switch with a fixed set of values (envs.CHOICES)."""
    return envs.CHOICES[name][0]


def _engine_process() -> bool:
    """Whether this engine's core runs in its own process (VLLM_ENABLE_V1_MULTIPROCESSING=1,
    as `vllm serve` runs it) rather than in the benchmark's."""
    return os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "0") == "1"


def _kernel_label(drafter: bool) -> str:
    """The linear kernel choice of this engine: VLLM_PRISM_PQ2_KERNEL, with the GEMV tile
    overrides in brackets when VLLM_PRISM_GEMV_TUNING sets any, and the float projections'
    GEMV when VLLM_PRISM_DENSE_GEMV is not the default, and on an engine with a drafter its
    attention when VLLM_PRISM_DRAFT_ATTENTION is not the default and the Gated DeltaNet
    kernel of its verification steps when VLLM_PRISM_GDN_VERIFY is not the default or
    VLLM_GDN_DECODE_KERNEL is set; ``[engine process]`` where the engine core has its own
    process."""
    kern = os.environ.get("VLLM_PRISM_PQ2_KERNEL", "auto") or "auto"
    tune = os.environ.get("VLLM_PRISM_GEMV_TUNING", "").strip()
    dense, draft = envs.VLLM_PRISM_DENSE_GEMV, envs.VLLM_PRISM_DRAFT_ATTENTION
    label = f"{kern} [gemv {tune}]" if tune else kern
    gdn = os.environ.get("VLLM_GDN_DECODE_KERNEL", "auto").strip() or "auto"
    label = label if dense == _default("VLLM_PRISM_DENSE_GEMV") else f"{label} [dense {dense}]"
    if envs.VLLM_PRISM_PQ2_FOLD_PREFILL:
        label = f"{label} [fold prefill]"
    if not envs.VLLM_PRISM_PREFILL_FRESH_KV:
        label = f"{label} [fresh kv 0]"
    if envs.VLLM_PRISM_ATTN_DECODE_SPLIT != "auto":
        label = f"{label} [decode split {envs.VLLM_PRISM_ATTN_DECODE_SPLIT}]"
    if not envs.VLLM_PRISM_ATTN_PDL:
        label = f"{label} [attn pdl 0]"
    if _engine_process():
        label = f"{label} [engine process]"
    if not drafter:
        return label
    if draft != _default("VLLM_PRISM_DRAFT_ATTENTION"):
        label = f"{label} [draft attention {draft}]"
    if envs.VLLM_PRISM_GDN_VERIFY != _default("VLLM_PRISM_GDN_VERIFY"):
        label = f"{label} [gdn verify {envs.VLLM_PRISM_GDN_VERIFY}]"
    if not envs.VLLM_PRISM_ATTN_VERIFY_LAZY:
        label = f"{label} [verify lazy 0]"
    form = envs.VLLM_PRISM_ATTN_VERIFY_FORM
    if form != _default("VLLM_PRISM_ATTN_VERIFY_FORM"):
        label = f"{label} [verify form {form}]"
    return label if gdn == "auto" else f"{label} [gdn {gdn}]"


def engine_switches(env: dict[str, str]) -> dict[str, str]:
    """The value of every ENGINE_SWITCHES variable an engine ran with, as its environment gave
    it (an empty value: unset); kept in each record, because the labels of _kernel_label name
    only what differs from the defaults of the tree that ran."""
    return {name: env.get(name, "") for _, name, _ in ENGINE_SWITCHES}


def _switches_key(r: dict) -> tuple | None:
    """The merge key's part for the switches: a record replaces an earlier one only where
    both ran with the same explicit values. Records written before the switches were kept
    (None) are never replaced by new ones: a label without a switch meant the default of
    its own day (VLLM_PRISM_ATTN_VERIFY_FORM's was mma, now auto)."""
    return tuple(sorted(r["switches"].items())) if "switches" in r else None


def _variant(r: dict) -> tuple:
    """What distinguishes runs of one measurement: KV dtype, mode, TP size, PDL, PQ2 kernel,
    attention kernel."""
    return (r["kv"], r["mode"], r.get("tp", 1), r.get("pdl", 0), r.get("pq2_kernel", "auto"),
            r.get("attn_kernel", "auto"))


def _plain_variant(r: dict) -> tuple:
    """_variant without the labels of the switches only an engine with a drafter reads (the
    drafter's attention, the verification step's Gated DeltaNet and attention kernels): a
    plain engine runs each with its first value, unlabelled."""
    kern = re.sub(r" \[(draft attention|gdn verify|gdn|verify lazy|verify form) [\w-]+\]", "",
                  r.get("pq2_kernel", "auto"))
    return _variant({**r, "pq2_kernel": kern})


def _add_verify_ratios(records: list[dict]) -> None:
    """``ratio_to_plain`` of each verify record: over the plain batch-1 decode step of the same
    run, KV dtype, mode, tp and context (and the same switches, those of the speculative path
    aside)."""
    plain = {_plain_variant(r) + (r["context"],): r["ms_per_step"]
             for r in records if r["kind"] == "decode" and r["batch"] == 1}
    for r in records:
        base = plain.get(_plain_variant(r) + (r["context"],))
        if r["kind"] == "verify" and base:
            r["ratio_to_plain"] = r["ms_per_step"] / base


def write_results(out_dir: Path, gpu: str, command: str, read_gbps: float,
                  records: list[dict]) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"e2e_{gpu}.json"
    old = json.loads(path.read_text())["records"] if path.is_file() else []
    key = lambda r: (r["kind"], r["batch"], r["context"], r.get("q_tokens", 1),  # noqa: E731
                     *_variant(r), r.get("drafter", ""), _switches_key(r))
    new_keys = {key(r) for r in records}
    merged = [r for r in old if key(r) not in new_keys] + records
    doc = {"gpu": gpu, "date": datetime.date.today().isoformat(), "command": command,
           "read_gbps": read_gbps, "records": merged}
    path.write_text(json.dumps(doc, indent=1) + "\n")
    runs = {}
    for r in merged:
        runs.setdefault(r.get("command", command), (r.get("date", doc["date"]),
                                                    r.get("read_gbps", read_gbps),
                                                    r.get("step_timing", "")))
    lines = [f"# End-to-end through vLLM on {gpu}", "", "Runs (read bandwidth measured in "
             "each run; `ceiling_frac` uses its own run's figure):", ""]
    lines += [f"- {d}: `{c}` ({g:.0f} GB/s; decode step from {t or 'request timestamps'})"
              for c, (d, g, t) in runs.items()]
    lines += ["", "| kind | mode | kv | tp | pdl | pq2 kernel | attn | batch | q_tokens | "
              "context | tok/s | ms/step | ceiling_frac | gpu_busy_frac | verify / plain step | "
              "date |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    notes = []
    for r in sorted(merged, key=lambda r: (r["kind"], *_variant(r), r["context"], r["batch"],
                                           r.get("q_tokens", 1), r.get("date", ""))):
        mark = ""
        if r.get("unreliable"):
            notes.append(r["unreliable"])
            mark = " *"
        kind = r["kind"] + (f" (drafter {r['drafter']})" if "drafter" in r else "")
        lines.append(f"| {kind} | {r['mode']} | {r['kv']} | {r.get('tp', 1)} | "
                     f"{r.get('pdl', 0)} | {r.get('pq2_kernel', 'auto')} | "
                     f"{r.get('attn_kernel', 'auto')} | {r['batch']} | {r.get('q_tokens', 1)} | "
                     f"{r['context']} | {r['tok_s']:.1f}{mark} | {r['ms_per_step']:.2f} | "
                     f"{r.get('ceiling_frac', float('nan')):.3f} | "
                     f"{r.get('gpu_busy_frac', float('nan')):.3f} | "
                     f"{r.get('ratio_to_plain', float('nan')):.3f} | "
                     f"{r.get('date', doc['date'])} |")
    for note in dict.fromkeys(notes):
        lines += ["", f"\\* Not a measurement to rely on: {note}."]
    plans = (f"{r['kind'].capitalize()} engine (context {r['context']}"
             f"{', drafter ' + r['drafter'] if 'drafter' in r else ''}): "
             f"{len(r['kv_cache_groups'])} KV-cache groups, at most "
             f"{max(r['kv_cache_groups'], default=0)} layers each."
             for r in merged if "kv_cache_groups" in r and r["kind"] != "prefill")
    for plan in dict.fromkeys(plans):  # the KV-cache plan a step's host work grows with
        lines += ["", plan]
    prof = [r for r in merged if "kernel_us_per_step" in r]
    for r in prof:
        step_kind = ("decode step" if r["kind"] == "decode"
                     else f"{r['kind']} step of {r.get('q_tokens', 1)} tokens")
        lines += ["", f"Batch-{r['batch']} {step_kind} by kernel family ({r['mode']}, {r['kv']}, "
                  f"pdl {r.get('pdl', 0)}, {r.get('pq2_kernel', 'auto')}, "
                  f"attention {r.get('attn_kernel', 'auto')}, "
                  f"context {r['context']}): {r['kernels_per_step']:.0f} kernels, "
                  f"{r['busy_us_per_step']:.0f} us busy of {r['ms_per_step'] * 1e3:.0f} us"
                  + (f" ({r['traced_step_us']:.0f} us a step in the profiled calls)"
                     if "traced_step_us" in r else ""), "",
                  "| family | us per step | own us per step | share of step |",
                  "|---|---|---|---|"]
        owns = r.get("kernel_own_us_per_step", {})
        for fam, us in sorted(r["kernel_us_per_step"].items(), key=lambda kv: -kv[1]):
            own = f"{owns[fam]:.0f}" if fam in owns else ""
            lines.append(f"| {fam} | {us:.0f} | {own} | {us / (r['ms_per_step'] * 1e3):.3f} |")
        if r.get("top_kernels_per_step"):
            lines += ["", "`own us`: the instants where the kernel is the earliest-started one "
                      "running (with programmatic dependent launch a kernel's span includes its "
                      "wait for the one before it).", "",
                      "| kernel | family | us per step | own us per step | launches per step |",
                      "|---|---|---|---|---|"]
            lines += [f"| `{t['name']}` | {t['family']} | {t['us']:.1f} | "
                      f"{t['own_us'] if 'own_us' in t else ''} | {t['launches']:.1f} |"
                      for t in r["top_kernels_per_step"]]
    for r in (r for r in merged if "host_top_cumulative" in r):
        step_kind = ("decode step" if r["kind"] == "decode"
                     else f"{r['kind']} step of {r.get('q_tokens', 1)} tokens")
        lines += ["", f"Host Python of a batch-{r['batch']} {step_kind} ({r['kv']}, "
                  f"{r.get('pq2_kernel', 'auto')}, context {r['context']}), cProfile: "
                  f"{r['host_ms_per_step']:.2f} ms own time a step (under the profiler)", "",
                  "| function | cumulative ms per step | own ms per step |", "|---|---|---|"]
        lines += [f"| `{t['function']}` | {t['cum_ms']:.3f} | {t['own_ms']:.3f} |"
                  for t in r["host_top_cumulative"]]
    md = path.with_suffix(".md")
    md.write_text("\n".join(lines) + "\n")
    return path


def _on_off(p: argparse.ArgumentParser, flag: str, default: str, help_text: str) -> None:
    """An engine switch of ENGINE_SWITCHES that is on (1) or off (0), one engine per value
    given."""
    p.add_argument(flag, nargs="+", default=[default], choices=["1", "0"], help=help_text)


def _choice(p: argparse.ArgumentParser, flag: str, name: str, help_text: str) -> None:
    """An engine switch of ENGINE_SWITCHES with a fixed set of values (envs.CHOICES[name], the
    first its default), one engine per value given."""
    p.add_argument(flag, nargs="+", default=[_default(name)], choices=envs.CHOICES[name],
                   help=help_text)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("model")
    p.add_argument("--kv", nargs="+", default=["auto", "int8_per_token_head"])
    p.add_argument("--mode", choices=["default", "eager"], default="default")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64])
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--long-context", type=int, default=32768)
    p.add_argument("--prefill", type=int, nargs="*", default=[512, 4096])
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--gpu-memory", type=float, default=0.85)
    p.add_argument("--no-profile", dest="profile", action="store_false")
    p.add_argument("--profile-batches", type=int, nargs="+", default=[1],
                   help="the batch sizes whose decode step is profiled by kernel family")
    p.add_argument("--host-profile", action="store_true",
                   help="also profile the host's Python per step (cProfile; the verify step "
                   "and the --profile-batches decode steps; engine core in this process only)")
    p.add_argument("--tp", type=int, nargs="+", default=[1],
                   help="tensor_parallel_size; several: one engine each, in the same run")
    p.add_argument("--spec-k", type=int, nargs="*", default=[],
                   help="verify-step records with a DFlash drafter, one engine per k")
    p.add_argument("--spec-only", action="store_true",
                   help="with --spec-k: only the verify engines (no plain engines)")
    p.add_argument("--drafter", help="the DFlash drafter folder for --spec-k (default: "
                   "vllm-prism make-tiny-drafter for the model, in a temporary folder)")
    p.add_argument("--drafter-layers", type=int, default=5,
                   help="layers of the default tiny drafter (default 5: the Bonsai 2 drafter's "
                   "count, which decides vLLM's KV-cache groups)")
    p.add_argument("--drafter-window", type=int, default=2048,
                   help="the default tiny drafter's sliding window (default 2048, the Bonsai 2 "
                   "drafter's; 0: full attention)")
    p.add_argument("--pdl", type=int, nargs="+", default=[1], choices=[0, 1],
                   help="VLLM_PRISM_PDL for the engines (default 1, as served); 1 0: each "
                   "engine with and without")
    p.add_argument("--pq2-kernel", nargs="+", default=["auto"],
                   help="VLLM_PRISM_PQ2_KERNEL for the engines, each in turn")
    p.add_argument("--attn-kernel", nargs="+", default=["auto"],
                   choices=["auto", "triton", "cuda"],
                   help="VLLM_PRISM_ATTN_KERNEL for the engines, each in turn (auto: the CUDA "
                   "C++ INT8 decode and verification attention where built; triton: the Triton "
                   "split-KV kernel; cuda: the same as auto)")
    p.add_argument("--gemv-tuning", nargs="+", default=[""],
                   help="VLLM_PRISM_GEMV_TUNING for the engines, each in turn (e.g. "
                   "'depth=2,scales=1' 'split=4'; '' for the defaults)")
    _choice(p, "--dense-gemv", "VLLM_PRISM_DENSE_GEMV",
            "VLLM_PRISM_DENSE_GEMV for the engines, each in turn (the float "
            "projections: auto, the small-M Triton GEMV at M <= 8; torch, F.linear; "
            "triton, the GEMV at every M <= 16)")
    _choice(p, "--draft-attention", "VLLM_PRISM_DRAFT_ATTENTION",
            "VLLM_PRISM_DRAFT_ATTENTION for the engines with a drafter, each in "
            "turn (a drafter's attention with an INT8 KV cache: the PRISM backend, or "
            "vLLM's choice)")
    _choice(p, "--gdn-verify", "VLLM_PRISM_GDN_VERIFY",
            "VLLM_PRISM_GDN_VERIFY for the engines with a drafter, each in turn "
            "(the Gated DeltaNet recurrence of a verification step: vllm-prism's kernel "
            "reading its inputs in place, or vLLM's choice)")
    p.add_argument("--gdn-spec-kernel", nargs="+", default=["auto"],
                   choices=["auto", "cuda", "triton"],
                   help="vLLM's VLLM_GDN_DECODE_KERNEL for the engines with a drafter, each in "
                   "turn (the Gated DeltaNet of a verification step: auto leaves it unset, "
                   "vLLM's choice: its fused CUDA kernel, one program per value head, where "
                   "the layer allows, else its Triton kernels; cuda or triton names one)")
    _on_off(p, "--fold-prefill", "0",
            "VLLM_PRISM_PQ2_FOLD_PREFILL for the engines, each in turn (0: the exact "
            "gemm_dq prefill from M = 512; 1: wgmma_fold in its place on Hopper where the "
            "codes are ternary)")
    _on_off(p, "--fresh-kv", "1",
            "VLLM_PRISM_PREFILL_FRESH_KV for the engines, each in turn (1: a "
            "prompt's first chunk attends to the step's own K and V; 0: it reads them "
            "back from the KV cache)")
    p.add_argument("--attn-decode-split", nargs="+", default=["auto"],
                   choices=["auto", "2", "1"],
                   help="VLLM_PRISM_ATTN_DECODE_SPLIT for the engines, each in turn (warps a "
                   "16-slot tile and KV head in the CUDA C++ INT8 decode kernel: 2 each over "
                   "half of the head dimension, 1 the four-warp kernel, auto 1 with "
                   "programmatic dependent launch and 2 without)")
    _on_off(p, "--attn-pdl", "1",
            "VLLM_PRISM_ATTN_PDL for the engines, each in turn (1: the CUDA C++ "
            "INT8 attention kernels and their merge with programmatic dependent launch "
            "where VLLM_PRISM_PDL allows it; 0: without)")
    _on_off(p, "--attn-verify-lazy", "1",
            "VLLM_PRISM_ATTN_VERIFY_LAZY for the engines with a drafter, each in "
            "turn (1: the CUDA C++ INT8 verification kernel keeps its running maxima "
            "across stages while the scores stay within 2^8 of them; 0: the exact "
            "softmax every stage)")
    _choice(p, "--attn-verify-form", "VLLM_PRISM_ATTN_VERIFY_FORM",
            "VLLM_PRISM_ATTN_VERIFY_FORM for the engines with a drafter, each in "
            "turn (the CUDA C++ INT8 verification kernel on mma.sync, or its "
            "warpgroup-MMA form on Hopper)")
    _on_off(p, "--engine-process", "0",
            "VLLM_ENABLE_V1_MULTIPROCESSING for each engine in turn: 0 (default) "
            "the engine core in the benchmark's process, where the torch profiler sees "
            "its kernels and every step's host work runs serially with the GPU; 1 in "
            "its own process, as `vllm serve` runs it (no profile)")
    p.add_argument("--side-by-side", action="store_true",
                   help="start every engine at once (--gpu-memory shared among them); they "
                   "measure one at a time")
    p.add_argument("--kv-cache-gib", type=float, default=8.0,
                   help="with --side-by-side: each engine's KV cache (vLLM's free-memory "
                   "profiling cannot size it while other engines start); the 27B-shaped "
                   "file's Gated DeltaNet state takes ~25 MiB a sequence, and vLLM wants one "
                   "state block per sequence of max_num_seqs (256): 4 GiB held only 163")
    p.add_argument("--out-dir", default=str(HERE.parent / "results"))
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--turn-lock", help=argparse.SUPPRESS)
    p.add_argument("--engines", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--engine-index", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--rounds", type=int, default=1,
                   help="measure every engine this many times (side by side: in start order, "
                   "then in reverse, alternating), each record the round of median step time "
                   "with all rounds' as rounds_ms: an A/B whose order could matter")
    _defaults_from_environment(p)
    return p


def _defaults_from_environment(p: argparse.ArgumentParser) -> None:
    """A switch of ENGINE_SWITCHES set in this process's environment is its option's default
    (every engine runs with it unless the option names values), as someone who exports it
    expects; SystemExit naming the variable where the option refuses its value."""
    actions = {a.dest: a for a in p._actions}
    for dest, name, _ in ENGINE_SWITCHES:
        raw = os.environ.get(name)
        if raw is None:
            continue
        action = actions[dest]
        try:
            value = action.type(raw.strip()) if action.type else raw.strip().lower()
        except ValueError:
            value = None
        if value is None or (action.choices is not None and value not in action.choices):
            raise SystemExit(f"bench_decode: {name}={raw!r} in the environment is not a value "
                             f"of {action.option_strings[0]}: use one of {action.choices}")
        p.set_defaults(**{dest: [value]})


# The switches each engine of a run can take, in label order: (option dest, environment
# variable, label key). Every value of every option gets its own engine, except that a
# switch of SPEC_ONLY_SWITCHES takes its first value alone on the plain engines.
ENGINE_SWITCHES = (("pdl", "VLLM_PRISM_PDL", "pdl"),
                   ("pq2_kernel", "VLLM_PRISM_PQ2_KERNEL", "kernel"),
                   ("gemv_tuning", "VLLM_PRISM_GEMV_TUNING", "gemv"),
                   ("attn_kernel", "VLLM_PRISM_ATTN_KERNEL", "attn"),
                   ("dense_gemv", "VLLM_PRISM_DENSE_GEMV", "dense"),
                   ("draft_attention", "VLLM_PRISM_DRAFT_ATTENTION", "draft"),
                   ("gdn_verify", "VLLM_PRISM_GDN_VERIFY", "verify"),
                   ("gdn_spec_kernel", "VLLM_GDN_DECODE_KERNEL", "gdn"),
                   ("fold_prefill", "VLLM_PRISM_PQ2_FOLD_PREFILL", "fold"),
                   ("fresh_kv", "VLLM_PRISM_PREFILL_FRESH_KV", "fresh"),
                   ("attn_decode_split", "VLLM_PRISM_ATTN_DECODE_SPLIT", "split"),
                   ("attn_pdl", "VLLM_PRISM_ATTN_PDL", "attnpdl"),
                   ("attn_verify_lazy", "VLLM_PRISM_ATTN_VERIFY_LAZY", "lazy"),
                   ("attn_verify_form", "VLLM_PRISM_ATTN_VERIFY_FORM", "form"),
                   ("engine_process", "VLLM_ENABLE_V1_MULTIPROCESSING", "mp"))
# what only an engine with a drafter reads (VLLM_PRISM_GDN_VERIFY and vLLM's
# VLLM_GDN_DECODE_KERNEL choose for the speculative decoding path only)
SPEC_ONLY_SWITCHES = {"draft_attention", "gdn_verify", "gdn_spec_kernel", "attn_verify_lazy",
                      "attn_verify_form"}


def engine_runs(args: argparse.Namespace, argv: list[str], drafter: str | None,
                lock: str | None) -> list[tuple[list[str], dict[str, str], str]]:
    """(child command line, environment, label) of every engine of the run: one per KV dtype
    and TP size, one per --spec-k (batch 1, with ``drafter``), each with every value of every
    option of ENGINE_SWITCHES.
    ``argv`` is this process's arguments (the children get them all, then their own);
    ``lock`` is the side-by-side turn lock, if any."""
    # the plain engines: no drafter (an empty --spec-k overrides the one in argv)
    bases = [] if args.spec_k and args.spec_only else [
        (kv, ["--tp", str(tp), "--spec-k"]) for tp in args.tp for kv in args.kv]
    if args.spec_k:
        bases += [(args.kv[0], ["--tp", str(args.tp[0]), "--spec-k", str(k), "--drafter",
                                str(drafter), "--batches", "1"]) for k in args.spec_k]
    # the last switch outermost, the engine base innermost
    combos = [(*reversed(values), base) for *values, base in itertools.product(
        *(getattr(args, dest) for dest, _, _ in reversed(ENGINE_SWITCHES)), bases)]
    combos = [(*values, (kv, more)) for *values, (kv, more) in combos
              if "--drafter" in more or all(
                  v == getattr(args, dest)[0] for (dest, _, _), v in zip(ENGINE_SWITCHES, values)
                  if dest in SPEC_ONLY_SWITCHES)]
    out = []
    for index, (*values, (kv, more)) in enumerate(combos):
        cmd = [sys.executable, __file__, "--child", *argv, "--kv", kv, *more]
        if lock:  # vLLM's free-memory profiling would count the other engines' growth
            cmd += ["--turn-lock", lock, "--engines", str(len(combos)),
                    "--engine-index", str(index),
                    "--gpu-memory", f"{args.gpu_memory / len(combos):.3f}",
                    "--kv-cache-gib", str(args.kv_cache_gib)]
        env = {**os.environ, **{name: str(v) for (_, name, _), v in zip(ENGINE_SWITCHES, values)}}
        if env["VLLM_GDN_DECODE_KERNEL"] == "auto":  # unset: the model's own choice
            del env["VLLM_GDN_DECODE_KERNEL"]
        label = " ".join([f"kv={kv} {' '.join(more)}"] + [
            f"{key}={v if v != '' else 'default'}"
            for (_, _, key), v in zip(ENGINE_SWITCHES, values)])
        out.append((cmd, env, label))
    return out


def main() -> None:
    args = build_parser().parse_args()
    if args.child:
        run_engine(args)
        return

    import torch
    from timing import gpu_slug, read_bandwidth_gbps

    read_gbps = read_bandwidth_gbps()
    print(f"read bandwidth: {read_gbps:.0f} GB/s", file=sys.stderr, flush=True)
    torch.cuda.empty_cache()
    weights, geo = model_bytes(args.model)
    command = "python benchmarks/e2e/bench_decode.py " + " ".join(sys.argv[1:])
    records = []
    drafter = (args.drafter or _tiny_drafter(args.model, args.drafter_layers,
                                             args.drafter_window)) if args.spec_k else None
    lock = None
    if args.side_by_side:
        import tempfile

        lock = tempfile.mkstemp(prefix="bench-turn-")[1]
    children = engine_runs(args, sys.argv[1:], drafter, lock)
    path = None
    with ThreadPoolExecutor(max_workers=len(children) if lock else 1) as pool:
        futures = {pool.submit(_run_child, cmd, env, label, lock, args.rounds): (label, env)
                   for cmd, env, label in children}
        for fut in as_completed(futures):
            label, env = futures[fut]
            returncode, lines = fut.result()
            if returncode or not lines:
                print(f"engine for {label} failed (exit {returncode})", file=sys.stderr)
                continue
            for r in json.loads(lines[-1][len("RECORDS "):]):
                if r["kind"] == "decode":
                    need = step_bytes(weights, geo, r["kv"], r["batch"], r["context"])
                    r["ceiling_frac"] = need / (read_gbps * 1e9) / (r["ms_per_step"] * 1e-3)
                r.update(read_gbps=read_gbps, command=command,
                         date=datetime.date.today().isoformat(),
                         step_timing="request timestamps", switches=engine_switches(env))
                records.append(r)
            # written after every engine: a run cut off by a time limit keeps what it measured
            _add_verify_ratios(records)
            path = write_results(Path(args.out_dir), gpu_slug(), command, read_gbps, records)
    if path:
        print(path.with_suffix(".md").read_text())


# vLLM's own log lines (on the child's stdout) that say where an engine's start went: loading,
# compiling (or the compile cache), graph capture; and the kernel form the INT8 verification
# attention served (cuda_decode: "auto" names why it fell back); echoed with the others
STARTUP_LINE = re.compile(r"\b(took|takes)\b|compil|cache|verification attention runs the",
                          re.IGNORECASE)


def _run_child(cmd: list[str], env: dict[str, str], label: str,
               lock: str | None = None, rounds: int = 1) -> tuple[int, list[str]]:
    """Run one engine's child process; echo each measurement as it comes (with the seconds
    since the start, so a run cut off shows how far it got) and return its exit status and
    RECORDS lines. A child that fails counts as arrived at the side-by-side barriers of
    ``lock`` and as having taken its ``rounds`` measuring turns, so the other engines do not
    wait a timeout for it."""
    t0 = time.perf_counter()
    print(f"[{0:6.1f} s] engine {label}: starting", file=sys.stderr, flush=True)
    lines = []
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("RECORDS "):
                lines.append(line.rstrip("\n"))
            elif line.startswith("{") or STARTUP_LINE.search(line):
                print(f"[{time.perf_counter() - t0:6.1f} s] {line.rstrip()} ({label})",
                      file=sys.stderr, flush=True)
        returncode = proc.wait()
    print(f"[{time.perf_counter() - t0:6.1f} s] engine {label}: exit {returncode}",
          file=sys.stderr, flush=True)
    if returncode and lock:
        for stage in ("ready", "done"):
            _arrive(lock, stage, f"failed {proc.pid}")
        for rnd in range(rounds):
            _arrive(lock, "turns", f"failed {proc.pid} {rnd}")
    return returncode, lines


if __name__ == "__main__":
    main()
