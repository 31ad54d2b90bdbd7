"""The torch-free CUDA kernels of csrc/ compile for Ampere (sm_80) and Hopper (sm_90) on a
machine without a GPU, when a CUDA toolkit is there: a compile error in a kernel that only the
GPU machine would build shows in CI. (The torch op wrappers need torch's CUDA headers and are
built with the extension on GPU machines.)"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NVCC = shutil.which("nvcc")
TORCH_FREE = ["csrc/pq2/mma_int8.cu"]


@pytest.mark.skipif(NVCC is None, reason="no CUDA toolkit (nvcc) on this machine")
@pytest.mark.parametrize("arch", ["80", "90"])
@pytest.mark.parametrize("source", TORCH_FREE)
def test_kernel_compiles(source: str, arch: str, tmp_path: Path) -> None:
    res = subprocess.run([NVCC, "-c", "-std=c++17", "-O3", "--use_fast_math",
                          f"-arch=sm_{arch}", "-Xptxas", "-v", f"-I{ROOT / 'csrc'}",
                          str(ROOT / source), "-o", str(tmp_path / "k.o")],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    # Every kernel instantiation compiled to a cubin entry without local-memory spills.
    entries = re.findall(r"Compiling entry function '([^']+)'", res.stderr)
    assert entries, res.stderr[-2000:]
    spills = re.findall(r"(\d+) bytes spill stores", res.stderr)
    assert all(int(s) == 0 for s in spills), res.stderr[-4000:]
