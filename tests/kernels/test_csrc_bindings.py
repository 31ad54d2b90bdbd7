"""The op registrations of csrc/torch_bindings.cpp load, on a machine without a GPU: every
schema string parses and matches the C++ signature its m.impl gives (torch checks the schema
inferred from the function's type against the declared one when the library loads), so a
signature changed in csrc/ops.h and not in the schema, or the reverse, fails here and not in
the GPU machine's build of vllm_prism._C. (test_csrc_compile.py compiles the bindings and the
op wrappers; a schema string is only parsed, and checked against its function, at load.)

The bindings are built with the C++ compiler against torch's headers, the sm_90a ops included,
with a stub for every function csrc/ops.h declares (the real ones need CUDA), and loaded in a
child process."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_csrc_compile import _include_dirs

ROOT = Path(__file__).resolve().parents[2]
CSRC = ROOT / "csrc"
CXX = shutil.which("c++") or shutil.which("g++")

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

    (tmp_path / "stubs.cpp").write_text(stubs())
    lib = tmp_path / "prism_bindings.so"
    torch_lib = Path(torch.__file__).parent / "lib"
    cmd = [CXX, "-shared", "-fPIC", "-O0", "-std=c++17", "-DPRISM_HAS_SM90A",
           f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
           *_include_dirs(tmp_path), str(CSRC / "torch_bindings.cpp"),
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
