"""The extension's CMake helpers (cmake/utils.cmake) link the shared C++ runtime.

On the GPU machine (CUDA 13, g++ 13, 2026-12-01) vllm_prism._C came out with libstdc++ linked
in statically: every op refusal whose message formats an integer (``TORCH_CHECK(ok, "M = ",
m)``) crashed the process in ``std::basic_ostream::_M_insert<long>`` (the module's own copy of
the locale facets is not the process's), while string-only messages raised. This builds a
one-op module with ``prism_define_extension`` and the runtime forced static
(``-static-libstdc++``: the failure mode) and checks that the module still needs the shared
libstdc++.so.6 and that the integer reaches the error message."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CMAKE = shutil.which("cmake")
GXX = shutil.which("g++")
READELF = shutil.which("readelf")

_OP = """
#include <torch/all.h>
#include <torch/library.h>
void refuse(const torch::Tensor& t, int64_t v) { TORCH_CHECK(v == 0, "refuse: v = ", v, "!"); }
TORCH_LIBRARY(_prism_cmake_check, m) {
  m.def("refuse(Tensor t, int v) -> ()");
  m.impl("refuse", c10::kCPU, &refuse);
}
"""

_CALL = """
import torch
torch.ops.load_library({module!r})
try:
    torch.ops._prism_cmake_check.refuse(torch.zeros(1), 5)
except RuntimeError as e:
    print("raised:", str(e).splitlines()[0])
"""


@pytest.mark.skipif(CMAKE is None or GXX is None or READELF is None,
                    reason="needs cmake, g++ and readelf")
def test_module_links_the_shared_cxx_runtime(tmp_path: Path, child_python) -> None:
    (tmp_path / "op.cpp").write_text(_OP)
    (tmp_path / "CMakeLists.txt").write_text(textwrap.dedent(f"""\
        cmake_minimum_required(VERSION 3.20)
        project(check LANGUAGES CXX)
        list(APPEND CMAKE_MODULE_PATH {ROOT / 'cmake'})
        include(utils)
        set(CMAKE_CXX_STANDARD 17)
        prism_find_torch({sys.executable})
        prism_define_extension(_check SOURCES ${{CMAKE_CURRENT_LIST_DIR}}/op.cpp)
        """))
    build = tmp_path / "build"
    for cmd in ([CMAKE, "-S", str(tmp_path), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
                 "-DCMAKE_CXX_COMPILER=" + GXX, "-DCMAKE_MODULE_LINKER_FLAGS=-static-libstdc++"],
                [CMAKE, "--build", str(build), "-j2"]):
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    module = next(build.glob("_check*.so"))
    needed = subprocess.run([READELF, "-d", str(module)], capture_output=True, text=True)
    assert "libstdc++.so.6" in needed.stdout, needed.stdout
    r = child_python(_CALL.format(module=str(module)), Path(__file__).parent)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "raised: refuse: v = 5!" in r.stdout, r.stdout
