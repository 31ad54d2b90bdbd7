"""Shared pytest configuration: GPU tests skip where CUDA is absent."""

from __future__ import annotations

from pathlib import Path

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    try:
        import torch
        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def run_interpreter_script(script: "Path", timeout: int = 900) -> str:
    """Run a check script of the tests in a subprocess under the Triton CPU interpreter
    (TRITON_INTERPRET must be set before triton is imported); its stdout."""
    import os
    import subprocess
    import sys

    here = script.resolve().parent
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join(
        [str(here), str(root), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


@pytest.fixture(scope="session")
def triton_interpreter():
    """``triton_interpreter(script_path) -> stdout``: see run_interpreter_script."""
    pytest.importorskip("triton")
    return run_interpreter_script


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory):
    """``tiny_gguf(fmt="pq2_0", seed=0) -> Path``: the tiny Bonsai-architecture model,
    written once per session per (format, seed). Tests must not modify the file."""
    from vllm_prism.gguf.tiny import make_tiny_gguf

    made: dict[tuple[str, int], Path] = {}

    def make(fmt: str = "pq2_0", seed: int = 0) -> Path:
        if (fmt, seed) not in made:
            path = tmp_path_factory.mktemp("tiny") / f"tiny-{fmt}-s{seed}.gguf"
            make_tiny_gguf(path, fmt=fmt, seed=seed)
            made[fmt, seed] = path
        return made[fmt, seed]

    return make
