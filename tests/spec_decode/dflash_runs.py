"""The DFlash runs the CPU and GPU speculative-decoding tests compare: the tiny target alone and
with the tiny drafter at each k, one engine per run (tests/e2e/vllm_runner.py)."""

from __future__ import annotations

from pathlib import Path

from e2e.test_llm import run_vllm


def dflash_requests(drafter: str | Path, request: dict, *, llm: dict | None = None,
                    ks: tuple[int, ...] = (3, 7), plain: bool = True,
                    drafter_quantization: str | None = None,
                    **spec_request: object) -> dict[int, dict]:
    """The runner requests of dflash_runs by k (0: the plain run, only if ``plain``);
    ``dflash_runs`` says what the arguments mean."""
    base = dict(llm or {})
    out = {0: {**request, "llm": base}} if plain else {}
    for k in ks:
        spec = {"method": "dflash", "model": str(drafter), "num_speculative_tokens": k}
        if drafter_quantization:
            spec["quantization"] = drafter_quantization
        out[k] = {**request, **spec_request,
                  "llm": {**base, "speculative_config": spec, "disable_log_stats": False}}
    return out


def dflash_runs(target: Path, drafter: str | Path, request: dict, tmp: Path, *,
                llm: dict | None = None, ks: tuple[int, ...] = (3, 7), plain: bool = True,
                drafter_quantization: str | None = None,
                **spec_request: object) -> dict[int, dict]:
    """``{0: plain result, k: result with DFlash drafting k tokens}`` (the plain run only if
    ``plain``), one engine after another. ``drafter_quantization`` quantizes the drafter
    online (vLLM's speculative ``quantization``, e.g. "fp8"). ``llm`` holds LLM() arguments
    for every run; ``spec_request`` adds request fields to the DFlash runs (e.g.
    ``record_cudagraphs=True``); the DFlash runs also return vLLM's speculative counters."""
    reqs = dflash_requests(drafter, request, llm=llm, ks=ks, plain=plain,
                           drafter_quantization=drafter_quantization, **spec_request)
    return {k: run_vllm(target, r, tmp) for k, r in reqs.items()}
