"""Where a Bonsai engine's start goes: Triton's JIT compiles and autotuning by kernel, beside the
whole start of vLLM's ``LLM()`` (engine core in this process, so that both are seen).

    python benchmarks/e2e/bench_startup.py MODEL.gguf [--kv int8_per_token_head]
        [--max-len 33024] [--out benchmarks/results] [--gpu h200]

vLLM's own log lines say how long loading, torch.compile, the first profiling run and graph
capture took; this adds what the profiling run spends its time on: every Triton kernel's
compiles (``JITFunction._do_compile``, each specialization) and every autotuned kernel's
benchmarking of its configurations (``Autotuner._bench``, its compiles included). Writes
``startup_{gpu}.json`` and ``.md`` under ``--out``, one record per run (replacing one of the
same command). A start on a machine whose Triton cache (~/.triton/cache) already holds the
kernels shows what a user's second start costs.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import time
from collections import defaultdict
from pathlib import Path


class KernelTimes:
    """Seconds and calls per Triton kernel name, for one kind of work."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] += seconds
        self.calls[name] += 1

    def total(self) -> float:
        return sum(self.seconds.values())


def _kernel_name(fn) -> str:
    """A Triton kernel's name: its module's last part and its function's name."""
    base = getattr(fn, "base_fn", None) or getattr(fn, "fn", None) or fn
    module = getattr(base, "__module__", "") or ""
    return f"{module.rsplit('.', 1)[-1]}.{getattr(base, '__name__', repr(base))}"


def instrument_triton() -> tuple[KernelTimes, KernelTimes]:
    """Time every JIT compile and every autotuning benchmark from now on, by kernel."""
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.jit import JITFunction

    compiles, tuning = KernelTimes(), KernelTimes()
    JITFunction._do_compile = _timed(JITFunction._do_compile, compiles)
    Autotuner._bench = _timed(Autotuner._bench, tuning)
    return compiles, tuning


def _timed(method, times: KernelTimes):
    """``method`` (of a kernel object) adding each call's seconds to ``times`` by kernel."""

    def timed(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return method(self, *args, **kwargs)
        finally:
            times.add(_kernel_name(self), time.perf_counter() - start)

    return timed


def start_engine(args: argparse.Namespace) -> float:
    """Seconds ``LLM()`` took to return a ready engine."""
    from vllm import LLM

    start = time.perf_counter()
    llm = LLM(args.model, kv_cache_dtype=args.kv, enable_prefix_caching=False,
              max_model_len=args.max_len, max_num_batched_tokens=8192, seed=0,
              gpu_memory_utilization=args.gpu_memory)
    seconds = time.perf_counter() - start
    del llm
    return seconds


def record(args: argparse.Namespace, command: str, start_s: float, compiles: KernelTimes,
           tuning: KernelTimes) -> dict:
    names = sorted(set(compiles.seconds) | set(tuning.seconds),
                   key=lambda n: -(compiles.seconds.get(n, 0.0) + tuning.seconds.get(n, 0.0)))
    return {"date": datetime.date.today().isoformat(), "command": command, "kv": args.kv,
            "max_len": args.max_len, "start_s": round(start_s, 2),
            "triton_compile_s": round(compiles.total(), 2),
            "triton_autotune_s": round(tuning.total(), 2),
            "triton_cache_autotuning": os.environ.get("TRITON_CACHE_AUTOTUNING", ""),
            "kernels": [{"kernel": n, "compiles": compiles.calls.get(n, 0),
                         "compile_s": round(compiles.seconds.get(n, 0.0), 3),
                         "configs_benched": tuning.calls.get(n, 0),
                         "autotune_s": round(tuning.seconds.get(n, 0.0), 3)} for n in names]}


def write_results(out: Path, gpu: str, rec: dict, top: int) -> Path:
    """Merge ``rec`` into ``startup_{gpu}.json`` (one record per command) and rewrite the .md."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"startup_{gpu}.json"
    old = json.loads(path.read_text())["records"] if path.is_file() else []
    records = [r for r in old if r["command"] != rec["command"]] + [rec]
    path.write_text(json.dumps({"gpu": gpu, "records": records}, indent=1) + "\n")
    lines = [f"# Engine start on {gpu}: Triton compiles and autotuning", "",
             "`compile s`: JITFunction._do_compile, every specialization; `autotune s`: "
             "Autotuner._bench over the configurations, their compiles included (so the two "
             "overlap for autotuned kernels).", ""]
    for r in records:
        lines += [f"## {r['date']}: `{r['command']}`", "",
                  f"LLM() ready in {r['start_s']:.1f} s; Triton compiles "
                  f"{r['triton_compile_s']:.1f} s, autotuning {r['triton_autotune_s']:.1f} s "
                  f"(TRITON_CACHE_AUTOTUNING={r['triton_cache_autotuning'] or 'unset'}).", "",
                  "| kernel | compiles | compile s | configs benched | autotune s |",
                  "|---|---|---|---|---|"]
        lines += [f"| `{k['kernel']}` | {k['compiles']} | {k['compile_s']:.2f} | "
                  f"{k['configs_benched']} | {k['autotune_s']:.2f} |"
                  for k in r["kernels"][:top]]
        lines.append("")
    path.with_suffix(".md").write_text("\n".join(lines))
    return path


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("model")
    p.add_argument("--kv", default="int8_per_token_head")
    p.add_argument("--max-len", type=int, default=33024)
    p.add_argument("--gpu-memory", type=float, default=0.85)
    p.add_argument("--gpu", default="h200", help="the results file's GPU name")
    p.add_argument("--top", type=int, default=30, help="kernels listed in the .md")
    p.add_argument("--out", type=Path, default=Path(__file__).parents[1] / "results")
    return p


def main() -> None:
    import sys

    args = build_parser().parse_args()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core in this process
    command = "python benchmarks/e2e/bench_startup.py " + " ".join(sys.argv[1:])
    compiles, tuning = instrument_triton()
    start_s = start_engine(args)
    path = write_results(args.out, args.gpu, record(args, command, start_s, compiles, tuning),
                         args.top)
    sys.stdout.write(path.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
