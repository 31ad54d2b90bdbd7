"""Build vllm-prism: pure Python everywhere, plus the CUDA extension vllm_prism._C where possible.

The extension is built by CMake from csrc/ (CMakeLists.txt) against the installed torch, as
vLLM builds its own kernels. It is built only when a CUDA toolkit (nvcc) and a CUDA build of
torch are both present; otherwise the package installs as pure Python and the Triton/torch
paths in vllm_prism/_custom_ops.py are used. VLLM_PRISM_TARGET_DEVICE=cpu skips the build,
=cuda makes a failed detection an error.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).parent.resolve()
logger = logging.getLogger("vllm_prism.setup")


def _cuda_build_possible() -> tuple[bool, str]:
    """Whether the CUDA extension can be built here, and why not."""
    if os.environ.get("VLLM_PRISM_TARGET_DEVICE", "").lower() == "cpu":
        return False, "VLLM_PRISM_TARGET_DEVICE=cpu"
    try:
        import torch
    except ImportError:
        return False, "torch is not installed in the build environment (use --no-build-isolation)"
    if torch.version.cuda is None:
        return False, f"torch {torch.__version__} is not a CUDA build"
    cuda_home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    if shutil.which("nvcc") is None and not (Path(cuda_home) / "bin" / "nvcc").exists():
        return False, "no CUDA toolkit (nvcc) found"
    if shutil.which("cmake") is None:
        return False, "cmake is not installed"
    return True, ""


class CMakeExtension(Extension):
    """An extension whose sources CMake compiles."""

    def __init__(self, name: str) -> None:
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    """Configure and build CMakeLists.txt; skip cleanly where CUDA is absent."""

    def run(self) -> None:
        ok, why = _cuda_build_possible()
        if not ok:
            if os.environ.get("VLLM_PRISM_TARGET_DEVICE", "").lower() == "cuda":
                raise RuntimeError(f"VLLM_PRISM_TARGET_DEVICE=cuda but {why}")
            sys.stderr.write(f"vllm-prism: not building vllm_prism._C ({why}); "
                             "installing the pure-Python package\n")
            return
        super().run()

    def build_extension(self, ext: Extension) -> None:
        import torch

        out_dir = Path(self.get_ext_fullpath(ext.name)).parent.resolve()
        build_dir = Path(self.build_temp).resolve()
        build_dir.mkdir(parents=True, exist_ok=True)
        config = "Debug" if self.debug else "Release"
        args = [
            f"-DCMAKE_BUILD_TYPE={config}",
            f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={out_dir}",
            f"-DVLLM_PRISM_PYTHON_EXECUTABLE={sys.executable}",
            f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}",
        ]
        if "CUDA_ARCHS" in os.environ:
            args.append(f"-DVLLM_PRISM_CUDA_ARCHS={os.environ['CUDA_ARCHS']}")
        jobs = os.environ.get("MAX_JOBS", str(os.cpu_count() or 1))
        subprocess.check_call(["cmake", str(ROOT), *args], cwd=build_dir)
        subprocess.check_call(["cmake", "--build", ".", "-j", jobs], cwd=build_dir)


setup(
    ext_modules=[CMakeExtension("vllm_prism._C")],
    cmdclass={"build_ext": CMakeBuild},
)
