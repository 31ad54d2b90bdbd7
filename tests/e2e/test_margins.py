"""`make-tiny --margins small`: a tiny model whose greedy tokens depend on the layers, so a
wrong transform changes them (the decisive default keeps them through bf16 noise, which also
lets some wrong transforms through greedy checks; log-probabilities catch those)."""

from __future__ import annotations

import pytest

from . import oracle

PROMPTS = ["Hello, world!", "The capital of France is", "Two plus two is four."]
NEW = 8


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    from vllm_prism.gguf.tiny import make_tiny_gguf

    path = tmp_path_factory.mktemp("margins") / "small.gguf"
    make_tiny_gguf(path, fmt="pq2_0", seed=7, margins="small")
    return path


def test_small_margins_expose_a_forgotten_rotation(small) -> None:
    tok = oracle.load_reference_tokenizer(small)
    prompts = [tok.encode(p) for p in PROMPTS]
    right = oracle.load_reference_model(small)
    wrong = oracle.load_reference_model(small, skip_unfold=True)
    got = [oracle.greedy(right, p, NEW) for p in prompts]
    bad = [oracle.greedy(wrong, p, NEW) for p in prompts]
    assert got != bad
    margins = [float(oracle.top2_margins(right, p + g).min()) for p, g in zip(prompts, got)]
    assert min(margins) < 1.0, margins  # the layers, not the LM head, decide


def test_unknown_margins_are_refused(tmp_path) -> None:
    from vllm_prism.gguf.tiny import make_tiny_gguf

    with pytest.raises(ValueError, match="--margins must be one of"):
        make_tiny_gguf(tmp_path / "x.gguf", margins="huge")
