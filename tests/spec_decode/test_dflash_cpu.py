"""DFlash speculative decoding with a Bonsai GGUF target on the CPU build of vLLM: a DFlash
drafter in Hugging Face format (random weights here, written by the test) loads next to the
GGUF target, and greedy output with speculation equals greedy output without it, for k = 3
and 7 (the target verifies every drafted token). Acceptance is not asserted: a random
drafter is not accepted; the tiny drafter that is (make-tiny-drafter) is still to come."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm")
safetensors = pytest.importorskip("safetensors.torch")

from e2e.test_llm import run_vllm  # noqa: E402 (tests/ is on sys.path)

PROMPTS = [[5, 17, 42, 99], [300, 12, 7], [42, 43, 44, 45, 46]]
NEW_TOKENS = 16


def write_random_dflash_drafter(out: Path, hidden: int, vocab: int,
                                target_layers: list[int]) -> Path:
    """A one-layer DFlash drafter for a target of width ``hidden`` (config.json and
    model.safetensors); it shares the target's embedding and LM head."""
    heads, kv_heads, head_dim, inter = 4, 2, 64, 2 * hidden
    out.mkdir(parents=True, exist_ok=True)
    config = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3",
              "hidden_size": hidden, "intermediate_size": inter, "num_hidden_layers": 1,
              "num_attention_heads": heads, "num_key_value_heads": kv_heads,
              "head_dim": head_dim, "vocab_size": vocab, "rms_norm_eps": 1e-6,
              "max_position_embeddings": 4096, "rope_theta": 1e6, "hidden_act": "silu",
              "tie_word_embeddings": False, "torch_dtype": "bfloat16", "block_size": 4,
              "dflash_config": {"target_layer_ids": target_layers, "mask_token_id": 1}}
    (out / "config.json").write_text(json.dumps(config, indent=1))
    gen = torch.Generator().manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * 0.02).to(torch.bfloat16)

    ones = lambda n: torch.ones(n, dtype=torch.bfloat16)  # noqa: E731
    p = "layers.0."
    weights = {
        "fc.weight": rand(hidden, hidden * len(target_layers)),
        "hidden_norm.weight": ones(hidden), "norm.weight": ones(hidden),
        p + "self_attn.q_proj.weight": rand(heads * head_dim, hidden),
        p + "self_attn.k_proj.weight": rand(kv_heads * head_dim, hidden),
        p + "self_attn.v_proj.weight": rand(kv_heads * head_dim, hidden),
        p + "self_attn.o_proj.weight": rand(hidden, heads * head_dim),
        p + "self_attn.q_norm.weight": ones(head_dim),
        p + "self_attn.k_norm.weight": ones(head_dim),
        p + "mlp.gate_proj.weight": rand(inter, hidden),
        p + "mlp.up_proj.weight": rand(inter, hidden),
        p + "mlp.down_proj.weight": rand(hidden, inter),
        p + "input_layernorm.weight": ones(hidden),
        p + "post_attention_layernorm.weight": ones(hidden),
    }
    safetensors.save_file(weights, str(out / "model.safetensors"))
    return out


@pytest.fixture(scope="module")
def runs(tiny_gguf, tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("dflash")
    target = tiny_gguf("pq2_0", seed=7)
    drafter = write_random_dflash_drafter(tmp / "drafter", hidden=256, vocab=512,
                                          target_layers=[1, 2])
    request = {"prompts": PROMPTS, "max_tokens": NEW_TOKENS, "score": []}
    out = {"plain": run_vllm(target, request, tmp)}
    for k in (3, 7):
        spec = {"method": "dflash", "model": str(drafter), "num_speculative_tokens": k}
        out[k] = run_vllm(target, {**request, "llm": {"speculative_config": spec}}, tmp)
    return out


@pytest.mark.parametrize("k", [3, 7])
def test_greedy_with_dflash_equals_greedy_without(runs: dict, k: int) -> None:
    assert runs[k]["greedy"] == runs["plain"]["greedy"]
    assert all(len(g) == NEW_TOKENS for g in runs[k]["greedy"])
