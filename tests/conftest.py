"""Shared pytest configuration: GPU tests skip where CUDA is absent."""

from __future__ import annotations

import subprocess
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


# Set by a GPU test whose kernel never finished (tests/attention/attn_helpers.py's
# synchronize_or_fail): nothing more can run on that device, and the CUDA teardown at exit
# would wait on it, so the run ends once pytest has reported.
GPU_HUNG_ENV = "PRISM_GPU_HUNG"


def pytest_unconfigure(config: pytest.Config) -> None:
    import os
    import sys

    hung = os.environ.get(GPU_HUNG_ENV)
    if hung:
        print(f"\n{GPU_HUNG_ENV} is set: GPU work never finished ({hung}); "
              "ending the run with exit code 3 without CUDA's teardown", file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(3)


def run_python(args: list[str], here: Path, timeout: int = 900,
               **env: str) -> subprocess.CompletedProcess[str]:
    """``python <args>`` in a child process with ``here`` (a tests folder, for its helper
    modules) and the repository on PYTHONPATH and ``env`` added to the environment: a check
    that needs a fresh interpreter, or that must not take the test process down with it."""
    import os
    import sys

    root = Path(__file__).resolve().parents[1]
    full = dict(os.environ, **env, PYTHONPATH=os.pathsep.join(
        [str(here), str(root), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, *args], env=full, capture_output=True, text=True,
                          timeout=timeout)


def run_cpu_smoke(bench: str, out: Path, *args: str, timeout: int = 900) -> None:
    """``benchmarks/kernels/<bench> --cpu-smoke ARGS --out OUT`` under the Triton CPU
    interpreter in a child process; asserts that it exits cleanly (its files are in ``out``)."""
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "kernels" / bench
    proc = run_python([str(script), "--cpu-smoke", *args, "--out", str(out)], script.parent,
                      timeout, TRITON_INTERPRET="1")
    assert proc.returncode == 0, proc.stderr[-3000:]


def run_interpreter_script(script: "Path", timeout: int = 900) -> str:
    """Run a check script of the tests in a subprocess under the Triton CPU interpreter
    (TRITON_INTERPRET must be set before triton is imported); its stdout."""
    proc = run_python([str(script)], script.resolve().parent, timeout, TRITON_INTERPRET="1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


@pytest.fixture(scope="session")
def triton_interpreter():
    """``triton_interpreter(script_path) -> stdout``: see run_interpreter_script."""
    pytest.importorskip("triton")
    return run_interpreter_script


@pytest.fixture(scope="session")
def child_python():
    """``child_python(code, here, timeout=300) -> CompletedProcess``: ``python -X faulthandler
    -c code`` through run_python (a crash shows as its exit code and stderr)."""
    def run(code: str, here: Path, timeout: int = 300):
        return run_python(["-X", "faulthandler", "-c", code], here, timeout)
    return run


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
