"""DFlash speculative decoding with a Bonsai GGUF target on the CPU build of vLLM.

The drafter is `vllm-prism make-tiny-drafter` (vllm_prism/spec_decode/tiny_drafter.py): a
Hugging Face-format DFlash drafter that shares the target's (prism-quantized) embedding and
LM head and is built to agree with the tiny target on the first drafted token. Checked:
greedy output with speculation equals greedy output without it, for k = 3 and 7, and vLLM's
speculative-decoding counters show first-position acceptance far above chance (1 / 512), and
the CUDA-graph dispatch record (vllm_prism/engine/step_record.py) sees the verification steps;
acceptance needs the shared embedding (patch spec_decode_shared_embedding: without it vLLM
keeps an unloaded embedding and 1 draft in 68 was accepted).
"""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")
pytest.importorskip("safetensors")

from dflash_runs import dflash_runs  # noqa: E402 (this folder is on sys.path)

from vllm_prism.engine import step_record  # noqa: E402

PROMPTS = [[5, 17, 42, 99], [300, 12, 7], [42, 43, 44, 45, 46]]
NEW_TOKENS = 16


@pytest.fixture(scope="module")
def runs(tiny_gguf, tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("dflash")
    target = tiny_gguf("pq2_0", seed=7)
    from vllm_prism.spec_decode.tiny_drafter import make_tiny_drafter

    drafter = make_tiny_drafter(tmp / "drafter", target)["path"]
    request = {"prompts": PROMPTS, "max_tokens": NEW_TOKENS, "score": []}
    return dflash_runs(target, drafter, request, tmp, record_cudagraphs=True)


@pytest.mark.parametrize("k", [3, 7])
def test_greedy_with_dflash_equals_greedy_without(runs: dict, k: int) -> None:
    assert runs[k]["greedy"] == runs[0]["greedy"]
    assert all(len(g) == NEW_TOKENS for g in runs[k]["greedy"])


@pytest.mark.parametrize("k", [3, 7])
def test_the_tiny_drafter_is_accepted(runs: dict, k: int) -> None:
    stats = runs[k]["spec_decode"]
    drafts, per_pos = stats["num_drafts"], stats["num_accepted_tokens_per_pos"]
    assert drafts > 0 and len(per_pos) == k
    first = per_pos[0] / drafts
    mean_accepted = stats["num_accepted_tokens"] / drafts
    print(f"k={k}: {drafts} drafts, first-position acceptance {first:.2f}, "
          f"mean accepted length {mean_accepted:.2f}")
    assert first > 0.5  # chance: 1 / 512


@pytest.mark.parametrize("k", [3, 7])
def test_the_step_record_sees_every_verification_step(runs: dict, k: int) -> None:
    """vllm_prism/engine/step_record.py on a real engine: vLLM's dispatch of every step
    recorded, the verification steps (k + 1 tokens a request) among them, as many as the
    drafts vLLM counted over the requests batched in each (eager here: mode NONE)."""
    steps = runs[k]["cudagraphs"]
    verify = [s for s in steps if step_record.is_uniform(s, k + 1)]
    assert verify and {s[2] for s in verify} == {"NONE"}, steps
    drafts = runs[k]["spec_decode"]["num_drafts"]
    assert sum(s[0] // (k + 1) for s in verify) <= drafts, (steps, drafts)


def test_the_kv_cache_groups_hold_every_layer_once(runs: dict, tiny_gguf) -> None:
    """step_record.kv_cache_groups on a real engine: the groups vLLM planned for the target
    and the one-layer drafter hold every KV layer once (the target's Gated DeltaNet and
    full-attention layers and the drafter's), none twice, none left out."""
    from vllm_prism.gguf.qwen35 import qwen35_text_config
    from vllm_prism.gguf.reader import GGUFReader

    with GGUFReader(tiny_gguf("pq2_0", seed=7)) as r:
        layers = int(qwen35_text_config(r.metadata, r.path)["num_hidden_layers"])
    for k in (3, 7):
        groups = runs[k]["kv_cache_groups"]
        print(f"k={k}: {layers} target layers + 1 drafter layer in groups of {groups}")
        assert sum(groups) == layers + 1, (groups, layers)


def test_a_drafter_with_fewer_positions_than_the_requests_still_drafts(runs: dict, tiny_gguf,
                                                                     tmp_path) -> None:
    """A drafter whose checkpoint says 8 positions, next to requests that pass 20 (patch
    dflash_draft_positions raises its rotary table and its max_model_len to the target's):
    greedy output equals the plain run's and the drafts are still accepted. Without the
    max_model_len part vLLM's runner skipped the drafter past position 8 and no draft was
    accepted (0 of 45, against 24 of 24)."""
    from vllm_prism.spec_decode.tiny_drafter import make_tiny_drafter

    target = tiny_gguf("pq2_0", seed=7)
    drafter = make_tiny_drafter(tmp_path / "drafter", target, max_positions=8)["path"]
    request = {"prompts": PROMPTS, "max_tokens": NEW_TOKENS, "score": []}
    res = dflash_runs(target, drafter, request, tmp_path, ks=(3,), plain=False)[3]
    assert res["greedy"] == runs[0]["greedy"]
    stats = res["spec_decode"]
    assert stats["num_accepted_tokens_per_pos"][0] / stats["num_drafts"] > 0.5, stats
