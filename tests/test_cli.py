"""The `vllm-prism` command as a user runs it: exit status, stdout and stderr."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "vllm_prism", *args], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONWARNINGS": "ignore"})


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cli") / "tiny.gguf"
    res = _run("make-tiny", str(path), "--format", "pq2_0", "--seed", "3", "--layers", "8")
    assert res.returncode == 0, res.stderr
    assert "wrote" in res.stdout and path.exists()
    return path


def test_inspect_good_file(tiny: Path) -> None:
    res = _run("inspect", str(tiny))
    assert res.returncode == 0, res.stderr
    assert "architecture: qwen35" in res.stdout
    assert "layers 8: 6 Gated DeltaNet, 2 full attention (every 4th: [3, 7])" in res.stdout
    assert "PQ2_0" in res.stdout and "block 128" in res.stdout
    assert "problems: none" in res.stdout
    assert res.stderr == ""


def test_inspect_bad_file(tmp_path: Path, tiny: Path) -> None:
    bad = tmp_path / "truncated.gguf"
    bad.write_bytes(tiny.read_bytes()[:5000])
    res = _run("inspect", str(bad))
    assert res.returncode != 0
    assert str(bad) in res.stderr and "truncated" in res.stderr
    assert "Traceback" not in res.stderr


def test_inspect_missing_file(tmp_path: Path) -> None:
    res = _run("inspect", str(tmp_path / "nope.gguf"))
    assert res.returncode != 0
    assert "nope.gguf" in res.stderr and "no such file" in res.stderr


def test_make_tiny_rejects_bad_format(tmp_path: Path) -> None:
    res = _run("make-tiny", str(tmp_path / "x.gguf"), "--format", "q4_k")
    assert res.returncode == 2 and "invalid choice" in res.stderr
