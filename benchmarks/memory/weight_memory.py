"""Device memory of a Bonsai GGUF's weights once vLLM has loaded them, against the file size.

    python benchmarks/memory/weight_memory.py MODEL.gguf [MODEL2.gguf ...] [--out FILE.md]

For each file, one engine in its own process (eager mode; the weights do not depend on it)
reports three figures:

* ``file``: the GGUF's size on disk;
* ``held``: the bytes of every distinct tensor storage the loaded model holds on the device
  (parameters, buffers and tensor attributes of its modules; the KV cache excluded), by kind
  (prepared PQ2 planes, packed embedding rows, float tensors, Hadamard signs);
* ``vllm``: vLLM's own "Model loading took" figure (live allocations after the load, so a
  tensor the loader leaves alive outside the model shows as ``vllm - held``).

Prints one JSON record per file and writes a markdown table (``--out``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, os, sys
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
import torch
from vllm import LLM

llm = LLM(sys.argv[1], max_model_len=1024, enforce_eager=True, enable_prefix_caching=False,
          gpu_memory_utilization=0.5)
runner = llm.llm_engine.model_executor.driver_worker.worker.model_runner
model = runner.model
kinds, seen, top = {}, set(), []


def kind(attr: str, t: torch.Tensor) -> str:
    if attr.startswith("prism_codes") or attr.startswith("prism_scales"):
        return "pq2_planes"
    if attr.startswith("prism_signs"):
        return "signs"
    if t.dtype == torch.uint8:
        return "packed_rows"
    return "float"


for name, mod in model.named_modules():
    if name.endswith(".attn") or "kv_cache" in name:
        continue
    tensors = [(k, v) for k, v in vars(mod).items() if isinstance(v, torch.Tensor)]
    tensors += [(k, v) for k, v in mod._parameters.items() if v is not None]
    tensors += [(k, v) for k, v in mod._buffers.items() if v is not None]
    for attr, t in tensors:
        if attr == "kv_cache":
            continue
        st = t.untyped_storage()
        if st.data_ptr() in seen or st.nbytes() == 0:
            continue
        seen.add(st.data_ptr())
        k = kind(attr, t)
        kinds[k] = kinds.get(k, 0) + st.nbytes()
        top.append((st.nbytes(), f"{name}.{attr}", str(t.dtype), list(t.shape)))
top.sort(reverse=True)
print("RESULT " + json.dumps({
    "held": sum(kinds.values()), "held_by_kind": kinds,
    "vllm": int(getattr(runner, "model_memory_usage", 0) or 0),
    "device": str(next(model.parameters()).device), "largest": top[:6]}))
"""

def _size(n: float) -> str:
    return f"{n / (1 << 30):.2f} GiB" if abs(n) >= 1 << 30 else f"{n / (1 << 20):.2f} MiB"


def measure(path: str) -> dict:
    """One engine in a child process; returns the child's RESULT record plus the file size."""
    proc = subprocess.run([sys.executable, "-c", CHILD, path], stdout=subprocess.PIPE,
                          text=True, check=True)
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")][-1]
    rec = json.loads(line[len("RESULT "):])
    rec["model"] = path
    rec["file"] = os.path.getsize(path)
    return rec


def table(records: list[dict]) -> str:
    rows = ["| file | on disk | held by the model | vLLM 'Model loading took' | of which "
            "not in the model |", "|---|---|---|---|---|"]
    for r in records:
        vllm, extra = ((_size(r["vllm"]), _size(r["vllm"] - r["held"])) if r["vllm"]
                       else ("n/a", "n/a"))
        rows.append(f"| {Path(r['model']).name} | {_size(r['file'])} | {_size(r['held'])} | "
                    f"{vllm} | {extra} |")
    return "\n".join(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("models", nargs="+")
    p.add_argument("--out", help="write the markdown table here")
    args = p.parse_args()
    records = [measure(m) for m in args.models]
    for r in records:
        print(json.dumps(r))
    md = table(records)
    print(md)
    if args.out:
        head = (f"# Weight memory on {records[0]['device']}\n\n"
                f"{datetime.date.today()}: `python benchmarks/memory/weight_memory.py "
                f"{' '.join(args.models)}`\n\n")
        Path(args.out).write_text(head + md + "\n\n```json\n"
                                  + "\n".join(json.dumps(r) for r in records) + "\n```\n")


if __name__ == "__main__":
    main()
