"""The DFlash runs the CPU and GPU speculative-decoding tests compare: the tiny target alone and
with the tiny drafter at each k, one engine per run (tests/e2e/vllm_runner.py)."""

from __future__ import annotations

from pathlib import Path

from e2e.test_llm import run_vllm


def dflash_runs(target: Path, drafter: str | Path, request: dict, tmp: Path, *,
                llm: dict | None = None, ks: tuple[int, ...] = (3, 7), plain: bool = True,
                drafter_quantization: str | None = None,
                **spec_request: object) -> dict[int, dict]:
    """``{0: plain result, k: result with DFlash drafting k tokens}`` (the plain run only if
    ``plain``). ``drafter_quantization`` quantizes the drafter online (vLLM's speculative
    ``quantization``, e.g. "fp8"). ``llm`` holds LLM() arguments for every run; ``spec_request`` adds request
    fields to the DFlash runs (e.g. ``record_cudagraphs=True``); the DFlash runs also return
    vLLM's speculative counters."""
    base = dict(llm or {})
    out = {0: run_vllm(target, {**request, "llm": base}, tmp)} if plain else {}
    for k in ks:
        spec = {"method": "dflash", "model": str(drafter), "num_speculative_tokens": k}
        if drafter_quantization:
            spec["quantization"] = drafter_quantization
        out[k] = run_vllm(target, {**request, **spec_request,
                                   "llm": {**base, "speculative_config": spec,
                                           "disable_log_stats": False}}, tmp)
    return out
