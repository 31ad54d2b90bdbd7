"""Patch: a DFlash drafter's rotary table is only as long as its own checkpoint says.

What breaks: a DFlash drafter whose ``max_position_embeddings`` is below the target's
``max_model_len`` (a distilled drafter may say its training length; vllm-prism's tiny drafter
said 4096 next to the 262,144-token 27B-shaped target) crashes the engine once a request
passes that position: on a GPU a device-side assert in the drafter's rotary gather ("index
out of bounds: 0 <= tmp < 4096") kills the engine core, and every later request of the server
fails with it. (On vLLM's CPU build the gather reads past the table without an error.)

Why: the proposer feeds the drafter the target's positions (DFlash drafts share the target's
positional space, as EAGLE drafts do), but the drafter sizes its ``cos_sin_cache`` by its own
``max_position_embeddings``. vLLM 0.32 raises that value to the target's ``max_model_len``
for ``eagle`` and ``eagle3`` drafts only (``SpeculativeConfig.
_maybe_override_draft_max_position_embeddings``, vLLM #48894); ``dflash`` is left out.

The draft's ``max_model_len`` has the same fault: the draft ``ModelConfig`` derived it from the
checkpoint's positions before any override, so raising the table alone left it at 8 for an
8-position drafter; vLLM's V1 model runner (which the CPU build runs) skips the drafter once a
sequence plus its draft tokens pass the draft's max_model_len (``_input_fits_in_drafter``),
and no draft past that point was accepted (0 of 45 on the CPU build, 24 of 24 with the fix).

The fix (upstream): call the same override for ``dflash``, and let the draft's
``max_model_len`` follow. Here, at load time, ``SpeculativeConfig.__post_init__`` is wrapped:
after it, a ``dflash`` draft's config (the ``EAGLEConfig`` wrapper and the checkpoint config
inside it) gets the target's ``max_model_len`` as ``max_position_embeddings`` where its own is
smaller, through vLLM's own override, and where that raised it the draft's ``max_model_len``
becomes the target's (unless the speculative config names its own ``max_model_len``), before
any model is built. Other methods and drafters that already cover the target's length are
untouched.

Applies to: vLLM 0.32.x. Tests: tests/patches/test_dflash_draft_positions.py (configs, CPU);
tests/spec_decode/test_dflash_cpu.py (an 8-position drafter through vLLM's CPU build);
tests/spec_decode/test_dflash_gpu.py (a 16-position drafter through vLLM on a GPU). PR text:
docs/upstream/dflash-draft-positions.md.
"""

from __future__ import annotations

from typing import Any

from vllm_prism.patches import VllmPatch, is_patched, mark_patched

TARGET = "vllm.config.speculative.SpeculativeConfig.__post_init__"


def _raise_dflash_positions(config: Any) -> None:
    """The eagle override of vLLM, applied to a ``dflash`` draft's configs."""
    from vllm.config.speculative import SpeculativeConfig

    draft, target = config.draft_model_config, config.target_model_config
    if config.method != "dflash" or draft is None or target is None:
        return
    hf_config = draft.hf_config
    raised = False
    for cfg in (getattr(hf_config, "model", None), hf_config):
        if cfg is not None:
            before = getattr(cfg, "max_position_embeddings", None)
            SpeculativeConfig._maybe_override_draft_max_position_embeddings(
                cfg, target.max_model_len)
            raised |= getattr(cfg, "max_position_embeddings", None) != before
    # The draft's max_model_len was derived from its own positions before the table was
    # raised; left there, vLLM's V1 runner skips the drafter past it. A speculative
    # max_model_len the user set stays.
    if raised and config.max_model_len is None:
        draft.max_model_len = target.max_model_len  # vLLM capped it at the target's


def apply() -> bool:
    from vllm.config.speculative import SpeculativeConfig

    original = SpeculativeConfig.__post_init__
    if is_patched(original):
        return False

    def __post_init__(self: Any) -> None:
        original(self)
        _raise_dflash_positions(self)

    SpeculativeConfig.__post_init__ = mark_patched(__post_init__, original)
    return True


PATCH = VllmPatch(
    name="dflash_draft_positions",
    target=TARGET,
    vllm_versions=("0.32.*",),
    apply=apply,
    upstream_doc="docs/upstream/dflash-draft-positions.md",
    upstream="not yet filed (PR text in docs/upstream/dflash-draft-positions.md)",
    remove_when="SpeculativeConfig calls _maybe_override_draft_max_position_embeddings for "
                "dflash drafts and the draft's max_model_len follows the raised value",
    test="tests/patches/test_dflash_draft_positions.py",
)
