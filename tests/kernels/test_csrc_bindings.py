"""The torch side of vllm_prism._C, checked on a machine without a GPU (the GPU machine's build
is the first that links it all):

- the op registrations of csrc/torch_bindings.cpp load: every schema string parses and matches
  the C++ signature its m.impl gives (torch checks the schema inferred from the function's type
  against the declared one when the library loads), so a signature changed in csrc/ops.h and
  not in the schema, or the reverse, fails here. The bindings are built with the C++ compiler
  against torch's headers, the sm_90a ops included, with a stub for every function csrc/ops.h
  declares, and loaded in a child process;
- the torch op wrappers (csrc/*/*_op.cu, dequantize.cu) compile with nvcc against torch's
  headers (a CPU wheel's: stand-ins for the CUDA libraries' headers it names and the one header
  a CUDA build of torch generates; the wrappers use none of them).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CSRC = ROOT / "csrc"
CXX = shutil.which("c++") or shutil.which("g++")
NVCC = shutil.which("nvcc")
# The files of csrc/ that include torch (the rest are torch-free: test_csrc_compile.py).
TORCH_SOURCES = ["csrc/pq2/dequantize.cu", "csrc/pq2/gemv_int8_op.cu", "csrc/pq2/mma_int8_op.cu",
                 "csrc/pq2/mma_small_op.cu", "csrc/pq2/wgmma_prefill_op.cu",
                 "csrc/attention/int8_decode_op.cu", "csrc/attention/int8_verify_op.cu"]
# What ATen/cuda/CUDAContext.h includes from the CUDA libraries and a CUDA build of torch: the
# types its declarations name, nothing the wrappers call.
STAND_INS = {
    "cusparse.h": "typedef struct cusparseContext* cusparseHandle_t;\n"
                  "typedef enum { CUSPARSE_STATUS_SUCCESS = 0 } cusparseStatus_t;\n",
    "cublas_v2.h": "typedef struct cublasContext* cublasHandle_t;\n"
                   "typedef enum { CUBLAS_STATUS_SUCCESS = 0 } cublasStatus_t;\n",
    "cublasLt.h": "typedef struct cublasLtContext* cublasLtHandle_t;\n",
    "cusolverDn.h": "typedef struct cusolverDnContext* cusolverDnHandle_t;\n"
                    "typedef enum { CUSOLVER_STATUS_SUCCESS = 0 } cusolverStatus_t;\n",
    "cusolver_common.h": "",
    "c10/cuda/impl/cuda_cmake_macros.h": "",
}

_DECL = re.compile(r"^(torch::Tensor|void)\s+(\w+)\(([^;]*?)\);", re.M | re.S)


def declarations() -> list[tuple[str, str, str]]:
    """(return type, name, parameter list) of every function csrc/ops.h declares."""
    return _DECL.findall((CSRC / "ops.h").read_text())


def stubs() -> str:
    """A definition of each declared function that throws (the library only registers them)."""
    out = ['#include "ops.h"', ""]
    for ret, name, params in declarations():
        body = 'TORCH_CHECK(false, "stub");' + (" return {};" if ret != "void" else "")
        out.append(f"{ret} {name}({params}) {{ {body} }}")
    return "\n".join(out) + "\n"


def test_every_bound_function_is_declared() -> None:
    """What torch_bindings.cpp registers is what ops.h declares (the stubs cover it)."""
    bound = set(re.findall(r'm\.impl\("(\w+)"', (CSRC / "torch_bindings.cpp").read_text()))
    declared = {name for _, name, _ in declarations()}
    assert bound and bound == declared, (bound ^ declared)


@pytest.mark.skipif(CXX is None, reason="no C++ compiler on this machine")
def test_bindings_load_with_their_schemas(tmp_path: Path) -> None:
    import torch
    from torch.utils import cpp_extension

    (tmp_path / "stubs.cpp").write_text(stubs())
    lib = tmp_path / "prism_bindings.so"
    torch_lib = Path(torch.__file__).parent / "lib"
    cmd = [CXX, "-shared", "-fPIC", "-O0", "-std=c++17", "-DPRISM_HAS_SM90A",
           f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
           *(f"-I{p}" for p in cpp_extension.include_paths()), f"-I{CSRC}",
           f"-I{_python_include()}", str(CSRC / "torch_bindings.cpp"),
           str(tmp_path / "stubs.cpp"), f"-L{torch_lib}", f"-Wl,-rpath,{torch_lib}",
           "-lc10", "-ltorch_cpu", "-ltorch", "-o", str(lib)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-4000:]
    names = sorted({name for _, name, _ in declarations()})
    probe = ("import sys, torch; torch.ops.load_library(sys.argv[1]); "
             "print('\\n'.join(str(getattr(torch.ops._C_prism, n).default._schema) "
             "for n in sys.argv[2:]))")
    res = subprocess.run([sys.executable, "-c", probe, str(lib), *names], capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-4000:]
    schemas = dict(line.split("(", 1) for line in res.stdout.split("\n") if line)
    assert sorted(s.split("::")[-1] for s in schemas) == names
    fold = schemas["_C_prism::pq2_wgmma_fold_prefill"]
    assert "int levels" in fold, fold


def test_every_torch_source_is_listed() -> None:
    """TORCH_SOURCES is every file of csrc/ that includes torch."""
    found = sorted(str(p.relative_to(ROOT)) for p in CSRC.glob("*/*.cu")
                   if re.search(r"#include [<\"](torch|ATen|c10)/", p.read_text()))
    assert found == sorted(TORCH_SOURCES)


@pytest.mark.skipif(NVCC is None, reason="no CUDA toolkit (nvcc) on this machine")
def test_op_wrappers_compile(tmp_path: Path) -> None:
    from torch.utils import cpp_extension

    inc = tmp_path / "stand-ins"
    for name, text in STAND_INS.items():
        (inc / name).parent.mkdir(parents=True, exist_ok=True)
        (inc / name).write_text("#pragma once\n" + text)

    def build(source: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [NVCC, "-c", "-std=c++17", "-O0", "-gencode", "arch=compute_90a,code=sm_90a",
             "-DPRISM_HAS_SM90A", f"-I{CSRC}", f"-I{inc}",
             *(f"-I{p}" for p in cpp_extension.include_paths()), f"-I{_python_include()}",
             str(ROOT / source), "-o", str(tmp_path / (Path(source).stem + ".o"))],
            capture_output=True, text=True, timeout=900)

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = dict(zip(TORCH_SOURCES, pool.map(build, TORCH_SOURCES)))
    failed = {s: r.stderr[-3000:] for s, r in results.items() if r.returncode}
    assert not failed, failed


def _python_include() -> str:
    import sysconfig

    return sysconfig.get_paths()["include"]
