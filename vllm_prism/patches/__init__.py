"""vLLM fixes applied at load time, one module per fix.

Each module defines ``PATCH``, a :class:`VllmPatch` saying what it patches, why, the vLLM
versions it applies to and how to apply it; its pull-request text lives in docs/upstream/.
:func:`apply_patches` applies every patch whose version range matches the running vLLM.
"""

from __future__ import annotations

import fnmatch
import importlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

logger = logging.getLogger(__name__)

PATCH_MODULES = (
    "vllm_prism.patches.cli_distribution_version",
    "vllm_prism.patches.int8_scale_view_fill",
)


@dataclass(frozen=True)
class VllmPatch:
    """One documented fix to vLLM."""

    name: str
    target: str                      # the patched symbol
    vllm_versions: tuple[str, ...]   # fnmatch patterns of the vLLM versions it applies to
    apply: Callable[[], bool]        # returns True when it changed something
    upstream_doc: str                # docs/upstream/<file>.md

    def applies_to(self, version: str) -> bool:
        return any(fnmatch.fnmatch(version, p) for p in self.vllm_versions)


def apply_patches() -> list[str]:
    """Apply the patches that match the installed vLLM; the names of those applied."""
    import vllm

    version = getattr(vllm, "__version__", "")
    applied = []
    for module in PATCH_MODULES:
        patch: VllmPatch = importlib.import_module(module).PATCH
        if patch.applies_to(version) and patch.apply():
            applied.append(patch.name)
            logger.debug("vllm-prism: applied patch %s to %s", patch.name, patch.target)
    return applied
