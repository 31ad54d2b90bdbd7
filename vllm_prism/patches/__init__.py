"""vLLM fixes applied at load time, one module per fix.

Each module defines ``PATCH``, a :class:`VllmPatch` saying what it patches, why, the vLLM
versions it applies to, how to apply it, the upstream issue or pull request and its status,
when it can go, and its test; its pull-request text lives in docs/upstream/.
:func:`apply_patches` applies every patch whose version range matches the running vLLM and
warns about each one that does not (a fix left out is a behaviour change a user must know of).
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
    "vllm_prism.patches.dflash_draft_positions",
    "vllm_prism.patches.int8_scale_view_fill",
    "vllm_prism.patches.kv_cache_group_size",
    "vllm_prism.patches.pp_kv_cache_layout",
    "vllm_prism.patches.spec_decode_shared_embedding",
)


@dataclass(frozen=True)
class VllmPatch:
    """One documented fix to vLLM."""

    name: str                        # its module's name (VLLM_PRISM_DISABLED_PATCHES takes it)
    target: str                      # the patched symbol
    vllm_versions: tuple[str, ...]   # fnmatch patterns of the vLLM versions it applies to
    apply: Callable[[], bool]        # returns True when it changed something
    upstream_doc: str                # docs/upstream/<file>.md
    upstream: str                    # the upstream issue or PR and its status
    remove_when: str                 # the condition for dropping the patch
    test: str                        # the test that fails without it

    def applies_to(self, version: str) -> bool:
        return any(fnmatch.fnmatch(version, p) for p in self.vllm_versions)


def is_patched(fn: object) -> bool:
    """Whether ``fn`` is already one of our wrappers (a patch applies once per process)."""
    return bool(getattr(fn, "_prism_patched", False))


def mark_patched(wrapper: Callable, original: Callable) -> Callable:
    """Mark ``wrapper`` as our replacement of ``original`` (``__wrapped__`` keeps the original
    reachable, as functools.wraps does); returns the wrapper."""
    wrapper._prism_patched = True  # type: ignore[attr-defined]
    wrapper.__wrapped__ = original  # type: ignore[attr-defined]
    return wrapper


def apply_patches() -> list[str]:
    """Apply the patches that match the installed vLLM; the names of those applied."""
    import vllm

    from vllm_prism import envs

    version = getattr(vllm, "__version__", "")
    disabled = envs.VLLM_PRISM_DISABLED_PATCHES
    applied = []
    for module in PATCH_MODULES:
        patch: VllmPatch = importlib.import_module(module).PATCH
        if patch.name in disabled:
            logger.warning("vllm-prism: patch %s not applied (VLLM_PRISM_DISABLED_PATCHES)",
                           patch.name)
            continue
        if not patch.applies_to(version):
            logger.warning("vllm-prism: patch %s (%s) is written for vLLM %s, not %s: not "
                           "applied; see %s", patch.name, patch.target,
                           " / ".join(patch.vllm_versions), version, patch.upstream_doc)
            continue
        if patch.apply():
            applied.append(patch.name)
            logger.debug("vllm-prism: applied patch %s to %s", patch.name, patch.target)
    return applied
