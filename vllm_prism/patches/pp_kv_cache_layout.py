"""Patch: pipeline parallelism stops at start when a stage holds no attention layer.

What breaks: a hybrid model (Gated DeltaNet / Mamba layers with some attention layers) served
with ``--pipeline-parallel-size`` where one stage receives only linear-attention layers, e.g.
a 4-layer Bonsai-architecture model at PP=2 (stage 0: two Gated DeltaNet layers). vLLM 0.32
fails before the engine starts: "AssertionError: Workers disagree on supported KV cache
layouts: [['LBNHC', 'LBHNC', 'BLNHC', 'BLHNC', 'BHLNC', 'LHBNC'], ['LBHNC']]".

Why: every worker reports the KV-cache layouts its attention backends support
(``get_supported_kv_cache_layouts``), and ``resolve_kv_cache_layout``
(vllm/v1/attention/backends/utils.py) asserts the lists are equal, on the assumption that
"all ranks run the same backends". Under pipeline parallelism they do not: a stage without
an attention layer has no backend that constrains the layout and reports every layout.

The fix: when the lists differ, resolve over the layouts every rank supports, in the order of
the most constrained rank's list (the shortest), which is what the ranks that do hold
attention layers prefer; where no layout is common, vLLM's own assertion stands. Equal lists
(every model without this situation) take vLLM's path unchanged.

Upstream: not yet filed (PR text: docs/upstream/pp-kv-cache-layout.md). Remove when vLLM
resolves the layout over the ranks' common layouts.

Applies to: vLLM 0.32.x. Test: tests/patches/test_pp_kv_cache_layout.py (fails without the
patch; it also serves a 4-layer model at PP=2 on the CPU build).
"""

from __future__ import annotations

import logging
from typing import Any

from vllm_prism.patches import VllmPatch, is_patched, mark_patched

logger = logging.getLogger(__name__)

TARGET = "vllm.v1.attention.backends.utils.resolve_kv_cache_layout"


def common_layouts(supported_layouts: list[list[str]]) -> list[list[str]]:
    """Every rank's list replaced by the layouts all ranks support, in the order of the most
    constrained rank; the lists unchanged when they agree or have nothing in common."""
    if not supported_layouts or all(x == supported_layouts[0] for x in supported_layouts):
        return supported_layouts
    narrowest = min(supported_layouts, key=len)
    common = [name for name in narrowest if all(name in x for x in supported_layouts)]
    if not common:
        return supported_layouts
    logger.info("vllm-prism: ranks support different KV-cache layouts (a pipeline stage "
                "without attention layers); resolving over the common ones: %s",
                ", ".join(common))
    return [list(common) for _ in supported_layouts]


def apply() -> bool:
    import sys

    import vllm.v1.attention.backends.utils as utils

    original = utils.resolve_kv_cache_layout
    if is_patched(original):
        return False

    def resolve_kv_cache_layout(vllm_config: Any, supported_layouts: list[list[str]],
                                kv_cache_specs: Any = None) -> Any:
        return original(vllm_config, common_layouts(supported_layouts), kv_cache_specs)

    utils.resolve_kv_cache_layout = mark_patched(resolve_kv_cache_layout, original)
    # The engine core imports it by name: rebind it there if that module is already loaded
    # (a later import binds the patched function).
    core = sys.modules.get("vllm.v1.engine.core")
    if core is not None and getattr(core, "resolve_kv_cache_layout", None) is original:
        core.resolve_kv_cache_layout = resolve_kv_cache_layout
    return True


PATCH = VllmPatch(
    name="pp_kv_cache_layout",
    target=TARGET,
    vllm_versions=("0.32.*",),
    apply=apply,
    upstream_doc="docs/upstream/pp-kv-cache-layout.md",
    upstream="not yet filed",
    remove_when="vLLM resolves the KV-cache layout over the layouts all ranks support",
    test="tests/patches/test_pp_kv_cache_layout.py",
)
