"""Patch: a drafter cannot share a quantized target embedding (the width check reads bytes).

What breaks: an EAGLE / DFlash drafter without its own ``embed_tokens`` is meant to share the
target's embedding. Next to a Bonsai GGUF target vLLM 0.32 logs "Target embedding dim (68)
differs from draft embedding dim (256). Keeping separate embedding weights" and the drafter
runs with an embedding that was never loaded: its drafts are noise and none is accepted.

Why: ``SpecDecodeBaseProposer._maybe_share_embeddings`` (vllm/v1/spec_decode/
llm_base_proposer.py) compares ``weight.shape[-1]`` of the two embeddings. A quantized
embedding keeps packed rows (here 2 PQ2_0 blocks of 34 bytes = 68 "columns" for a width of
256), so the last dimension of its weight is a byte count, not the embedding width.

The fix (upstream): compare the layers' ``embedding_dim``. Here, at load time, the method is
wrapped: for the duration of the call the target embedding's ``weight`` is replaced by a
meta-device parameter of shape (rows, ``embedding_dim``), so vLLM's own check compares widths;
the packed weight is put back right after (vLLM shares the module, not the tensor). Targets
whose embedding weight already has its width as last dimension are untouched.

Applies to: vLLM 0.32.x. Test: tests/spec_decode/test_dflash_cpu.py (a tiny drafter built to
copy the target's successor structure is accepted only with the shared embedding). PR text:
docs/upstream/spec-decode-shared-embedding.md.
"""

from __future__ import annotations

from typing import Any

import torch

from vllm_prism.patches import VllmPatch, is_patched, mark_patched

TARGET = "vllm.v1.spec_decode.llm_base_proposer.SpecDecodeBaseProposer._maybe_share_embeddings"


def _target_embedding(target_language_model: Any) -> Any:
    inner = getattr(target_language_model, "model", None)
    return getattr(inner, "embed_tokens", None) or getattr(inner, "embedding", None)


def _width_view(embed: Any) -> torch.nn.Parameter | None:
    """A meta parameter (rows, embedding_dim) where the weight's last dim is not the width."""
    weight = getattr(embed, "weight", None)
    width = getattr(embed, "embedding_dim", None)
    if not isinstance(weight, torch.Tensor) or width is None or weight.dim() != 2 \
            or weight.shape[-1] == width:
        return None
    return torch.nn.Parameter(torch.empty(weight.shape[0], width, device="meta"),
                              requires_grad=False)


def apply() -> bool:
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer

    original = SpecDecodeBaseProposer._maybe_share_embeddings
    if is_patched(original):
        return False

    def _maybe_share_embeddings(self: Any, target_language_model: Any) -> None:
        embed = _target_embedding(target_language_model)
        view = _width_view(embed) if embed is not None else None
        if view is None:
            return original(self, target_language_model)
        packed = embed.weight
        embed.weight = view
        try:
            return original(self, target_language_model)
        finally:
            embed.weight = packed

    SpecDecodeBaseProposer._maybe_share_embeddings = mark_patched(_maybe_share_embeddings,
                                                                  original)
    return True


PATCH = VllmPatch(
    name="spec_decode_shared_embedding",
    target=TARGET,
    vllm_versions=("0.32.*",),
    apply=apply,
    upstream_doc="docs/upstream/spec-decode-shared-embedding.md",
    upstream="not yet filed (PR text in docs/upstream/spec-decode-shared-embedding.md)",
    remove_when="_maybe_share_embeddings compares embedding_dim rather than weight.shape[-1]",
    test="tests/spec_decode/test_dflash_cpu.py",
)
