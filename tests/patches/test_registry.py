"""The patch registry: every patch carries what a maintainer needs to drop it, and a patch
that does not match the installed vLLM is a warning, not a silent skip."""

from __future__ import annotations

import dataclasses
import importlib
import logging
from pathlib import Path

import pytest

pytest.importorskip("vllm")

from vllm_prism import patches  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("module", patches.PATCH_MODULES)
def test_patch_record_is_complete(module: str) -> None:
    p = importlib.import_module(module).PATCH
    assert p.upstream and p.remove_when
    assert (ROOT / p.test).is_file() and (ROOT / p.upstream_doc).is_file()
    assert p.applies_to("0.32.0")


def test_version_mismatch_is_a_warning(monkeypatch, caplog) -> None:
    import vllm

    monkeypatch.setattr(vllm, "__version__", "0.31.0")
    with caplog.at_level(logging.WARNING, logger="vllm_prism.patches"):
        applied = patches.apply_patches()
    assert applied == []
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == len(patches.PATCH_MODULES)
    assert all("0.31.0" in r.getMessage() for r in warned)


def test_a_patch_can_be_disabled_by_name(monkeypatch, caplog) -> None:
    """VLLM_PRISM_DISABLED_PATCHES skips the named patch with a warning, and only that one."""
    monkeypatch.setenv("VLLM_PRISM_DISABLED_PATCHES", "kv_cache_group_size")
    calls: list[str] = []
    for module in patches.PATCH_MODULES:
        mod = importlib.import_module(module)
        fake = dataclasses.replace(mod.PATCH, apply=lambda n=mod.PATCH.name: calls.append(n) or 1)
        monkeypatch.setattr(mod, "PATCH", fake)
    with caplog.at_level(logging.WARNING, logger="vllm_prism.patches"):
        applied = patches.apply_patches()
    names = {importlib.import_module(m).PATCH.name for m in patches.PATCH_MODULES}
    assert "kv_cache_group_size" in names
    assert set(applied) == set(calls) == names - {"kv_cache_group_size"}
    assert any("kv_cache_group_size" in r.getMessage() for r in caplog.records)
