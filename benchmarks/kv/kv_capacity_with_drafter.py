"""KV-cache capacity that vLLM itself logs for a Bonsai 2-layered target with a DFlash2-shaped
drafter, with and without the kv_cache_group_size patch, in the same run.

The target is `vllm-prism make-tiny --layers 64` (48 Gated DeltaNet + 16 full-attention
layers, Bonsai 2 27B's layer pattern at tiny widths); the drafter is
`vllm-prism make-tiny-drafter --layers 5 --sliding-window W` (DFlash2's 5 sliding-window
layers; the tiny target's 4K context asks for a window below DFlash2's 2048, as the padding
only costs full-attention memory when the context outgrows the window). Each configuration
starts one engine (CPU build or GPU) and the script reads vLLM's own log lines: "Add N
padding layers ..." and "... KV cache size: N tokens". Writes
benchmarks/results/kv_capacity_<device>.md.

    python benchmarks/kv/kv_capacity_with_drafter.py [--max-model-len 4096] [--window 128] \
        [--batched 256]
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ENGINE = """
import json, sys
from vllm import LLM
spec = {"method": "dflash", "model": sys.argv[2], "num_speculative_tokens": 5}
LLM(sys.argv[1], speculative_config=spec, max_model_len=int(sys.argv[3]), enforce_eager=True,
    enable_prefix_caching=False, dtype="bfloat16", gpu_memory_utilization=0.3,
    max_num_batched_tokens=int(sys.argv[4]))
"""


def _engine_log(target: Path, drafter: Path, max_len: int, batched: int, disabled: str) -> str:
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
           "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
           "VLLM_PRISM_DISABLED_PATCHES": disabled}
    res = subprocess.run([sys.executable, "-c", ENGINE, str(target), str(drafter), str(max_len),
                          str(batched)],
                         capture_output=True, text=True, env=env, timeout=900)
    if res.returncode != 0:
        raise RuntimeError(f"engine failed ({disabled or 'all patches'}):\n{res.stderr[-3000:]}")
    return res.stdout + res.stderr  # vLLM logs to stdout


def _parse(log: str) -> dict:
    tokens = re.findall(r"KV cache size: ([\d,]+) tokens", log)
    padding = re.findall(r"Add (\d+) padding layers, may waste at most ([\d.]+)%", log)
    return {"tokens": int(tokens[-1].replace(",", "")) if tokens else None,
            "padding": [(int(n), float(p)) for n, p in padding],
            "lines": [x.split("] ", 1)[-1] for x in log.splitlines()
                      if "KV cache size" in x or "padding layers" in x or
                      "kv_cache_group_size" in x]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--max-model-len", type=int, default=4096)  # the tiny target's limit
    p.add_argument("--batched", type=int, default=256,
                   help="max_num_batched_tokens (a sliding-window request holds its window "
                        "plus these in-flight tokens)")
    p.add_argument("--window", type=int, default=128,
                   help="the drafter's sliding window (DFlash2 for Bonsai 2: 2048)")
    p.add_argument("--out-dir", default=str(HERE.parent / "results"))
    args = p.parse_args()
    import torch

    from vllm_prism.gguf.tiny import make_tiny_gguf
    from vllm_prism.spec_decode.tiny_drafter import make_tiny_drafter

    device = torch.cuda.get_device_name().split()[-1].lower() if torch.cuda.is_available() \
        else "cpu"
    tmp = Path(tempfile.mkdtemp(prefix="kvcap-"))
    target = tmp / "tiny64.gguf"
    make_tiny_gguf(target, fmt="pq2_0", seed=7, layers=64)
    drafter = Path(make_tiny_drafter(tmp / "drafter", target, layers=5,
                                     sliding_window=args.window)["path"])
    runs = {"vLLM 0.32 as is (patch disabled)": _parse(_engine_log(
                target, drafter, args.max_model_len, args.batched, "kv_cache_group_size")),
            "with the kv_cache_group_size patch": _parse(_engine_log(
                target, drafter, args.max_model_len, args.batched, ""))}
    before, after = runs.values()
    cmd = "python benchmarks/kv/kv_capacity_with_drafter.py " + " ".join(sys.argv[1:])
    lines = [f"# KV-cache capacity with a DFlash2-shaped drafter ({device})", "",
             f"- {datetime.date.today()}: `{cmd.strip()}` (max_model_len "
             f"{args.max_model_len}, max_num_batched_tokens {args.batched}; target 48 GDN "
             "+ 16 full-attention layers, drafter 5 sliding-window layers, window "
             f"{args.window})", "",
             "| vLLM | KV cache tokens (vLLM's log) | padding vLLM logged |", "|---|---|---|"]
    for name, r in runs.items():
        pad = "; ".join(f"{n} layers, up to {pct:.2f} %" for n, pct in r["padding"]) or "none"
        lines.append(f"| {name} | {r['tokens']:,} | {pad} |")
    if before["tokens"] and after["tokens"]:
        lines += ["", f"Ratio after / before: **{after['tokens'] / before['tokens']:.3f}**"]
    lines += ["", "vLLM's log lines:", ""]
    for name, r in runs.items():
        lines += [f"- {name}:"] + [f"  - `{x}`" for x in r["lines"]]
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    out = Path(args.out_dir) / f"kv_capacity_{device}.md"
    out.write_text(text)


if __name__ == "__main__":
    main()
